#!/usr/bin/env bash
# Tools the test suite needs from outside the venv, installed only when missing.
#   bash scripts/tools.sh ensure chromium        headless browser for the status page test
#   bash scripts/tools.sh ensure promtool        Prometheus's rule checker and unit-test runner
#                                                (Debian's prometheus package)
#   bash scripts/tools.sh ensure node-packages   the AsyncAPI parser and Strimzi's CRD schemas,
#                                                exactly as scripts/node/package-lock.json says
# Idempotent: a tool already there is left alone. Installing with apt needs Debian's apt-get
# and root (or sudo); without them the script says what to install and fails. The npm
# packages need node and npm on PATH and no root.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODE_PACKAGES="$REPO/scripts/node"

need_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "tools.sh: need root to run: $*" >&2
        return 1
    fi
}

apt_install() {
    local package=$1
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "tools.sh: no apt-get here; install the '$package' package by hand" >&2
        return 1
    fi
    # Update the index only when the package is not known yet (a fresh image has none).
    if ! apt-cache show "$package" >/dev/null 2>&1; then
        need_root apt-get -o DPkg::Lock::Timeout=600 update -q
    fi
    # Another install running at the same time holds dpkg's lock: wait for it, bounded.
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        -o DPkg::Lock::Timeout=600 --no-install-recommends "$package"
}

# Debian's prometheus package is the server as well as promtool, and its installation starts
# the server where the init system runs services (a container's policy-rc.d usually
# forbids it). The tests need promtool only: the server is stopped and kept from starting
# at boot, so no Prometheus listens on :9090 because the tests ran.
prometheus_server_off() {
    if [ -d /run/systemd/system ]; then
        need_root systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        need_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        need_root update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
}

# npm ci installs exactly the lock (versions and sha512 integrity) into scripts/node; it
# runs again only when the lock changed since the last install. No install scripts run:
# none of these packages needs one (the only one declared reports usage).
node_packages() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "tools.sh: node and npm are needed for the npm packages (scripts/node)" >&2
        return 1
    fi
    local lock="$NODE_PACKAGES/package-lock.json"
    local stamp="$NODE_PACKAGES/node_modules/.installed-lock"
    if [ -f "$stamp" ] && cmp -s "$lock" "$stamp"; then
        return 0
    fi
    npm ci --prefix "$NODE_PACKAGES" --ignore-scripts --no-audit --no-fund --loglevel=error
    cp "$lock" "$stamp"
}

ensure() {
    case "$1" in
        chromium)
            if command -v chromium >/dev/null 2>&1; then
                return 0
            fi
            apt_install chromium
            ;;
        promtool)
            if command -v promtool >/dev/null 2>&1; then
                return 0
            fi
            apt_install prometheus
            prometheus_server_off
            ;;
        node-packages)
            node_packages
            ;;
        *)
            echo "tools.sh: unknown tool '$1' (known: chromium, promtool, node-packages)" >&2
            return 2
            ;;
    esac
}

case "${1:-}" in
    ensure)
        shift
        [ "$#" -gt 0 ] || { echo "usage: tools.sh ensure TOOL..." >&2; exit 2; }
        for tool in "$@"; do ensure "$tool"; done
        ;;
    *)
        echo "usage: tools.sh ensure TOOL..." >&2
        exit 2
        ;;
esac
