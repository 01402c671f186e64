#!/usr/bin/env bash
# Builds the mountguard images, the only recipe for them: the release
# (.github/workflows/release.yml) pushes what this writes, and the real-node
# test tier (scripts/test.sh) imports it into containerd. No container engine
# or registry: OCI image archives (an image index with one manifest per
# platform) from the static release binaries scripts/test.sh builds
# (block "Static release binaries"):
#
#   bash scripts/images.sh OUT_DIR
#
# writes OUT_DIR/mountguard-agent.tar, OUT_DIR/mountguard-controller.tar and
# OUT_DIR/pause.tar (the pod sandbox image of the real-node tier, from
# scripts/images/pause.c with musl-gcc), OUT_DIR/probe (scripts/images/probe.c,
# which the tier execs inside containers), and OUT_DIR/images.env with each
# image's reference and index digest:
#
#   AGENT_IMAGE=localhost/mountguard/mountguard-agent  AGENT_DIGEST=sha256:...
#
# Each image has a linux/amd64 manifest, and a linux/arm64 one when
# target/aarch64-unknown-linux-musl/release holds the arm64 binaries. Each
# image is one layer: the binary (refused unless `file` says it is static and
# of the platform's architecture), plus, in the controller image, the build
# machine's CA bundle (Debian ca-certificates) at
# /etc/ssl/certs/ca-certificates.crt, named by SSL_CERT_FILE in its Env, for
# slurmrestd over TLS (rustls native roots). docs/images.md says what else is
# (not) in them. Same binaries, same CA bundle and same SOURCE_DATE_EPOCH
# give the same bytes, hence the same digests.
# Environment: MOUNTGUARD_IMAGE_PREFIX (default localhost/mountguard),
# MOUNTGUARD_REQUIRE_ARM64=1 (a missing arm64 binary is an error, not a note;
# the release sets it), SOURCE_DATE_EPOCH (default: the last commit's time).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: images.sh OUT_DIR}"
mkdir -p "$out"
prefix="${MOUNTGUARD_IMAGE_PREFIX:-localhost/mountguard}"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/mountguard/Chart.yaml")"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

command -v musl-gcc >/dev/null || { echo "error: musl-gcc missing (Debian musl-tools)" >&2; exit 1; }
command -v file >/dev/null || { echo "error: file missing (Debian file)" >&2; exit 1; }
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if ! [ -f "$ca_bundle" ] || ! [ -r "$ca_bundle" ] || ! [ -s "$ca_bundle" ]; then
    echo "error: $ca_bundle missing, unreadable or empty: the controller image needs the" \
        "CA bundle of Debian's ca-certificates package (apt-get install ca-certificates)" >&2
    exit 1
fi
ca_version="$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null || echo unknown)"
echo "controller CA bundle: $ca_bundle (ca-certificates $ca_version)" >&2
musl-gcc -static -Os -s -o "$out/pause" "$repo/scripts/images/pause.c"
# Not an image: the static probe the tier execs inside containers.
musl-gcc -static -Os -s -o "$out/probe" "$repo/scripts/images/probe.c"
pause_digest="$(python3 "$repo/scripts/images/oci.py" --out "$out/pause.tar" \
    --name "$prefix/pause:3.10" --platform "linux/amd64=$out/pause" \
    --path /pause --entrypoint /pause --user 65535:65535)"

labels=(
    --label "org.opencontainers.image.source=https://github.com/mountguard/mountguard"
    --label "org.opencontainers.image.url=https://github.com/mountguard/mountguard"
    --label "org.opencontainers.image.documentation=https://github.com/mountguard/mountguard/tree/main/docs"
    --label "org.opencontainers.image.licenses=Apache-2.0"
    --label "org.opencontainers.image.vendor=mountguard"
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.created=$created"
)
static() { # binary, `file` architecture word
    local desc
    desc="$(file -bL "$1")"
    if ! [[ "$desc" =~ (statically|static-pie)\ linked ]] || [[ "$desc" != *"$2"* ]]; then
        echo "error: $1 is not a static $2 binary: $desc" >&2
        exit 1
    fi
}
image() { # name user description [oci.py options...]
    local name="$1" user="$2" desc="$3" platforms=()
    shift 3
    local amd="$repo/target/x86_64-unknown-linux-musl/release/$name"
    local arm="$repo/target/aarch64-unknown-linux-musl/release/$name"
    [ -x "$amd" ] || { echo "error: $amd missing; build the static binaries first (scripts/test.sh)" >&2; exit 1; }
    static "$amd" x86-64
    platforms+=(--platform "linux/amd64=$amd")
    if [ -x "$arm" ]; then
        static "$arm" 'ARM aarch64'
        platforms+=(--platform "linux/arm64=$arm")
    elif [ "${MOUNTGUARD_REQUIRE_ARM64:-0}" = 1 ]; then
        echo "error: $arm missing and MOUNTGUARD_REQUIRE_ARM64=1: build it with" \
            "cargo build --locked --release --target aarch64-unknown-linux-musl" \
            "-p mountguard-agent -p mountguard-controller --bins" >&2
        exit 1
    else echo "note: no $arm; $name has a linux/amd64 manifest only" >&2
    fi
    python3 "$repo/scripts/images/oci.py" --out "$out/$name.tar" --name "$prefix/$name:$version" \
        "${platforms[@]}" --path "/$name" --entrypoint "/$name" --cmd run --user "$user" \
        "${labels[@]}" --label "org.opencontainers.image.title=$name" \
        --label "org.opencontainers.image.description=$desc" "$@"
}
agent_digest="$(image mountguard-agent 0:0 "mountguard node agent: hashes the Secret and ConfigMap content the kubelet serves on a node")"
controller_digest="$(image mountguard-controller 65532:65532 "mountguard controller: verdicts, metrics, Events and opt-in remediation" \
    --file "$ca_bundle=/etc/ssl/certs/ca-certificates.crt:0644" \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)"
cat > "$out/images.env" <<EOF
VERSION=$version
PAUSE_IMAGE=$prefix/pause
PAUSE_TAG=3.10
PAUSE_DIGEST=$pause_digest
AGENT_IMAGE=$prefix/mountguard-agent
AGENT_DIGEST=$agent_digest
CONTROLLER_IMAGE=$prefix/mountguard-controller
CONTROLLER_DIGEST=$controller_digest
EOF
cat "$out/images.env"
