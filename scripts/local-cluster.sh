#!/usr/bin/env bash
# A one-node cluster on this machine with mountguard installed by Helm, to
# look at it as an operator would: the real control plane and kubelet
# v1.37 on containerd v2 and runc (built by scripts/node-tools.sh),
# kube-proxy, the images built here, the chart installed with the real Helm
# CLI (Helm 4), and Prometheus with the chart's
# alert rules. Needs root (containers, mounts, a bridge); everything lives
# in temporary directories and goes away with `down`.
#
#   bash scripts/local-cluster.sh up       # build what is missing, start, print how to look
#   bash scripts/local-cluster.sh rotate   # the seed rotation: slurm.key recreated while pinned
#   bash scripts/local-cluster.sh down     # uninstall and stop everything
#
# The first `up` on a fresh machine builds the pinned upstream programs
# (scripts/upstream.sh, scripts/node-tools.sh, cached in
# ~/.cache/mountguard-upstream) and the static binaries: about 25-30
# minutes on 2 cores; about 17 with the upstream programs already built;
# a few minutes after that.
set -euo pipefail
cd "$(dirname "$0")/.."
state="$PWD/target/local-cluster"
bin="$PWD/target/debug/mountguard-local-cluster"

log() { printf '==> %s\n' "$*" >&2; }

# Drops scripts/upstream.sh's SKIPPED: lines about the Slinky operator (and
# their indented continuation lines): this cluster does not run it. Every
# other line passes.
drop_slinky_skips() {
    awk '
        /^SKIPPED:   / { if (!drop) print; next }
        /^SKIPPED:/ { drop = ($0 ~ /Slinky operator|slurm-operator/); if (!drop) print; next }
        { drop = 0; print }
    '
}

prepare() {
    if [ "$(id -u)" != 0 ]; then
        echo "error: needs root (containers, mounts, a bridge); uid $(id -u)" >&2
        exit 1
    fi
    local pkgs=(containernetworking-plugins libseccomp-dev pkg-config gcc iptables iproute2
        musl-tools file ca-certificates prometheus python3-yaml) missing=()
    for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing Debian packages: ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    log "the pinned upstream programs (cached after the first run)"
    upstream_bin="$(bash scripts/upstream.sh 2> >(drop_slinky_skips >&2) | tail -n 1)"
    node_tools="$(bash scripts/node-tools.sh | tail -n 1)"
    log "static binaries and images (scripts/images.sh)"
    rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
        || rustup target add x86_64-unknown-linux-musl
    cargo build --locked --release --target x86_64-unknown-linux-musl \
        -p mountguard-agent -p mountguard-controller --bins
    bash scripts/images.sh "$state/images" >/dev/null
    cargo build --locked -p mountguard-tests --features real-upstream --bin mountguard-local-cluster
}

running_pid() {
    [ -f "$state/pid" ] || return 1
    local pid
    pid="$(cat "$state/pid")"
    kill -0 "$pid" 2>/dev/null && echo "$pid"
}

case "${1:-}" in
    up)
        if pid="$(running_pid)"; then
            echo "already up (pid $pid); scripts/local-cluster.sh down first" >&2
            exit 1
        fi
        prepare
        mkdir -p "$state"
        rm -f "$state/ready"
        log "starting (log: $state/up.log)"
        MOUNTGUARD_UPSTREAM_BIN="$upstream_bin" MOUNTGUARD_NODE_TOOLS_BIN="$node_tools" \
            MOUNTGUARD_IMAGES_DIR="$state/images" \
            nohup "$bin" up --state "$state" >"$state/up.log" 2>&1 &
        echo $! > "$state/pid"
        for _ in $(seq 600); do
            [ -f "$state/ready" ] && break
            if ! kill -0 "$(cat "$state/pid")" 2>/dev/null; then
                tail -n 30 "$state/up.log" >&2
                echo "error: the cluster did not come up (log above, $state/up.log)" >&2
                exit 1
            fi
            sleep 1
        done
        [ -f "$state/ready" ] || { echo "error: not ready after 600 s; see $state/up.log" >&2; exit 1; }
        sed -n '/^mountguard is installed/,$p' "$state/up.log"
        ;;
    rotate)
        "$bin" rotate --state "$state"
        ;;
    down)
        if ! pid="$(running_pid)"; then
            echo "not up" >&2
            exit 0
        fi
        kill -TERM "$pid"
        for _ in $(seq 180); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "error: pid $pid still running after 180 s; see $state/up.log" >&2
            exit 1
        fi
        rm -f "$state/pid"
        tail -n 2 "$state/up.log"
        ;;
    *)
        echo "usage: scripts/local-cluster.sh up|rotate|down" >&2
        exit 64
        ;;
esac
