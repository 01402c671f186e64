#!/usr/bin/env bash
# Runs the whole mountguard test suite. Installs what it needs on a fresh
# Debian machine (as root): cargo-nextest if missing, the arm64 cross
# toolchain and qemu-user for the agent's arm64 tests.
#
#   bash scripts/test.sh
#
# Environment:
#   MOUNTGUARD_SKIP_ARM64=1   skip the arm64 cross-build and qemu test run
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

apt_install() {
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "error: need Debian packages ${missing[*]}; run as root or install them first" >&2
        exit 1
    fi
    log "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if ! cargo nextest --version >/dev/null 2>&1; then
    log "installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

log "workspace tests (x86_64)"
cargo nextest run --workspace --no-fail-fast

if [ "${MOUNTGUARD_SKIP_ARM64:-0}" != 1 ]; then
    log "agent tests on arm64 (cross-built, run under qemu-aarch64)"
    apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
    rustup target list --installed | grep -qx aarch64-unknown-linux-gnu \
        || rustup target add aarch64-unknown-linux-gnu
    cargo nextest run --target aarch64-unknown-linux-gnu \
        -p mountguard-inventory -p mountguard-agent --no-fail-fast
fi
