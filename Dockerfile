# outbox-relay runtime image: `outbox-relay run` (relay + health sidecar), `run --no-relay`,
# `migrate`, `check`, ... Used by compose.yaml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the distribution needs (pyproject's readme must exist for the build).
COPY pyproject.toml README.md ./
COPY outbox_relay/ outbox_relay/
COPY relay/ relay/
COPY pgconnect/ pgconnect/
COPY health/ health/
COPY contracts/ contracts/
COPY scoring/ scoring/
COPY migrations/ migrations/
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin relay
USER relay
WORKDIR /home/relay

EXPOSE 8080
# Liveness only: /livez never touches PostgreSQL or Kafka. PORT-less default is 127.0.0.1:8080,
# so images set HEALTH_LISTEN_ADDR (compose does); the probe reads the port from it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; a = os.environ.get('HEALTH_LISTEN_ADDR', '127.0.0.1:8080'); urllib.request.urlopen('http://127.0.0.1:' + a.rsplit(':', 1)[1] + '/livez', timeout=2)"]

CMD ["outbox-relay", "run"]
