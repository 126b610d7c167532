# outbox-relay runtime image. The entry point is the CLI, so the command is the verb:
#   docker run IMAGE            relay + health sidecar in one process (`run`)
#   docker run IMAGE run --relay-only | run --no-relay | migrate | grant ... | check
# deploy/ (Kubernetes) and compose.yaml run it this way; tests/deploy holds them to it.
# Build: docker build --build-arg SOURCE=<repository URL> --build-arg REVISION=<commit> -t outbox-relay:0.1.0 .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Dependencies exactly as locked (versions and hashes; the OpenTelemetry SDK and OTLP/HTTP
# exporter among them, imported only when OTEL_* variables ask for an export), then the
# package itself without resolving anything again.
COPY requirements-runtime.lock /src/
RUN python -m venv /opt/outbox-relay \
    && /opt/outbox-relay/bin/pip install --require-hashes --no-deps -r /src/requirements-runtime.lock
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY outbox_relay/ outbox_relay/
COPY relay/ relay/
COPY pgconnect/ pgconnect/
COPY health/ health/
COPY contracts/ contracts/
COPY scoring/ scoring/
COPY migrations/ migrations/
RUN /opt/outbox-relay/bin/pip install --no-deps --no-build-isolation .

FROM python:3.11-slim
# VERSION is contracts.__version__ (tests/deploy holds the default to it); SOURCE and
# REVISION are where and what the image was built from, given by the build.
ARG VERSION=0.1.0
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="Relays committed transactional-outbox rows from PostgreSQL to Kafka, with a health sidecar." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /opt/outbox-relay /opt/outbox-relay
# A passwd entry, so the driver can name the OS user when a URL names none.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin relay
# Nothing is written at run time (no bytecode, logs on stderr), so the root filesystem may
# be read-only. PORT, not HEALTH_LISTEN_ADDR: the server listens on all interfaces of the
# container's network and a platform's PORT still moves it (HEALTH_LISTEN_ADDR wins over
# both).
ENV PATH=/opt/outbox-relay/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8080
# Numeric, so a pod's runAsNonRoot can verify it without a runAsUser of its own.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# Liveness only (/livez never touches PostgreSQL or Kafka), at the address the process
# resolves from the same variables.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-m", "outbox_relay.healthcheck"]
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
