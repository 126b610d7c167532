#!/usr/bin/env bash
# Tools the test suite needs from the operating system, installed only when missing.
#   bash scripts/tools.sh ensure chromium   headless browser for the status page test
# Idempotent: a tool already on PATH is left alone. Installing needs Debian's apt-get and
# root (or sudo); without them the script says what to install and fails.
set -euo pipefail

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

ensure() {
    case "$1" in
        chromium)
            if command -v chromium >/dev/null 2>&1; then
                return 0
            fi
            apt_install chromium
            ;;
        *)
            echo "tools.sh: unknown tool '$1' (known: chromium)" >&2
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
