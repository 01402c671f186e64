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
# With MOUNTGUARD_SLURM_PREFIX (the install prefix scripts/slurm.sh prints),
# it also writes OUT_DIR/slurmd.tar, the worker image of the real-node
# tier's NodeSet (SLURMD_IMAGE, SLURMD_DIGEST in images.env): not a
# mountguard image and never released, see slurmd_image below.
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
# The real-node tier's Slurm worker: slurmd as a NodeSet pod's container,
# as the Slinky images run it (slurm-operator v1.2.1
# internal/builder/workerbuilder/worker_app.go, `slurmdContainer`: the
# image's slurmd with `-Z --conf-server ...`, /usr/bin/sh and scontrol for
# the preStop hook). Slurm's binaries are dynamic: the image holds slurmd,
# slurmstepd and scontrol at the install prefix they were built for (their
# RUNPATH and slurmd's compiled-in slurmstepd path name it), the plugins
# and libslurmfull at a fixed path outside root's home (the prefix's
# lib/slurm a link to it), the host libraries `ldd` resolves for each (the
# loader included), dash as /bin/sh and /usr/bin/sh, hostname, six
# coreutils, and the passwd and group entries of root, slurm (the jobs'
# user) and nobody.
slurmd_image() { # prefix plugin_dir
    local p="$1" plugin_dir="$2" files=() f lib tmp
    tmp="$(mktemp -d)"
    # The Slinky operator's logfile sidecar runs its script with the same
    # image here (slurm-operator v1.2.1 internal/builder/common/scripts/
    # logfile.sh: mkdir, dirname, rm, mkfifo, cat, sleep): coreutils'.
    local tools=(mkdir dirname rm mkfifo cat sleep)
    local elves=("$p/sbin/slurmstepd" "$p/bin/scontrol" /bin/dash /bin/hostname)
    for f in "${tools[@]}"; do
        elves+=("/bin/$f")
        files+=(--file "/bin/$f=/usr/bin/$f:0755")
    done
    for f in "$p"/lib/slurm/*.so; do
        [ -L "$f" ] || elves+=("$f")
    done
    files+=(--file "$p/sbin/slurmstepd=$p/sbin/slurmstepd:0755"
        --file "$p/bin/scontrol=/usr/bin/scontrol:0755"
        --file "/bin/dash=/bin/sh:0755" --file "/bin/dash=/usr/bin/sh:0755"
        --file "/bin/hostname=/usr/bin/hostname:0755")
    # The plugins at SLURMD_PLUGIN_DIR, the PluginDir of the rig's
    # slurm.conf (slurmctld serves that file to configless slurmd; the rig
    # links the install's plugins to the same path on the host); Slurm's
    # libraries also at the install prefix, their RUNPATH.
    for f in "$p"/lib/slurm/*.so; do
        [ -L "$f" ] || files+=(--file "$f=$plugin_dir/$(basename "$f"):0755")
    done
    # slurmd loads auth/slurm from its compiled-in PluginDir (the
    # prefix's) before it has fetched slurm.conf: that directory is a link.
    files+=(--symlink "$p/lib/slurm=$plugin_dir")
    # Every library an ELF of the image needs, at the path the loader
    # looks for it (ldd's left column for the loader, its target for the
    # others), with the content of the file that path resolves to here.
    while read -r lib; do
        case "$lib" in "$p"/*) continue ;; esac
        files+=(--file "$(readlink -f "$lib")=$lib:0755")
    done < <(for f in "$p/sbin/slurmd" "${elves[@]}"; do
            ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
        done | sort -u)
    getent passwd root slurm nobody >"$tmp/passwd" \
        || { echo "error: no user slurm on this host (scripts/slurm.sh creates it)" >&2; exit 1; }
    getent group root slurm nogroup >"$tmp/group" || true
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$tmp/nsswitch.conf"
    files+=(--file "$tmp/passwd=/etc/passwd:0644" --file "$tmp/group=/etc/group:0644"
        --file "$tmp/nsswitch.conf=/etc/nsswitch.conf:0644")
    python3 "$repo/scripts/images/oci.py" --out "$out/slurmd.tar" --name "$prefix/slurmd:$(basename "$p")" \
        --platform "linux/amd64=$p/sbin/slurmd" --path /usr/sbin/slurmd \
        --entrypoint /usr/sbin/slurmd --entrypoint=-D --user 0:0 \
        --dir /tmp:1777 --dir /run:0755 --dir /var/spool/slurmd:0755 --dir /var/log/slurm:0755 \
        --label "org.opencontainers.image.title=slurmd (test worker)" "${files[@]}"
    rm -rf "$tmp"
}
slurmd_env=""
if [ -n "${MOUNTGUARD_SLURM_PREFIX:-}" ]; then
    [ -x "$MOUNTGUARD_SLURM_PREFIX/sbin/slurmd" ] \
        || { echo "error: MOUNTGUARD_SLURM_PREFIX=$MOUNTGUARD_SLURM_PREFIX has no sbin/slurmd (scripts/slurm.sh prints the prefix)" >&2; exit 1; }
    slurmd_plugins="/var/cache/mountguard-slurm/$(basename "$MOUNTGUARD_SLURM_PREFIX")/lib/slurm"
    slurmd_digest="$(slurmd_image "$MOUNTGUARD_SLURM_PREFIX" "$slurmd_plugins")"
    slurmd_env="SLURMD_IMAGE=$prefix/slurmd
SLURMD_TAG=$(basename "$MOUNTGUARD_SLURM_PREFIX")
SLURMD_DIGEST=$slurmd_digest
SLURMD_PLUGIN_DIR=$slurmd_plugins
SLURM_PREFIX=$MOUNTGUARD_SLURM_PREFIX"
fi
cat > "$out/images.env" <<EOF
VERSION=$version
PAUSE_IMAGE=$prefix/pause
PAUSE_TAG=3.10
PAUSE_DIGEST=$pause_digest
AGENT_IMAGE=$prefix/mountguard-agent
AGENT_DIGEST=$agent_digest
CONTROLLER_IMAGE=$prefix/mountguard-controller
CONTROLLER_DIGEST=$controller_digest
$slurmd_env
EOF
cat "$out/images.env"
