#!/usr/bin/env bash
# Builds the pinned upstream programs the real-control-plane tests run
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd, the
# Slinky operator manager) from the Go module proxy, into a cache directory
# outside the repository. Nothing of upstream's is committed: this script
# writes throwaway Go modules into the cache and builds them there.
#
#   bash scripts/upstream.sh            # build if needed, print the bin dir
#
# The last line on stdout is the directory holding the binaries (and, in
# crds/ beside it, the Slinky CRDs copied out of the module cache). A second
# run with the same pins prints the same directory without building. A
# program that cannot be built is reported on stderr with a SKIPPED: line
# (and its error kept in <dir>/<program>.error); today that is the Slinky
# operator, whose dependency slurm-client the module proxy refuses.
#
# The Slinky operator v1.2.x is built from local source checkouts instead
# (see "Slinky operator from checkouts" below): when both are found, a line
# `slinky-operator-dir: <dir>` is printed on stdout before the last line;
# <dir> holds bin/slurm-operator, crds/ and rbac/ of that release.
#
# Environment:
#   MOUNTGUARD_UPSTREAM_DIR  cache root (default ~/.cache/mountguard-upstream)
#   MOUNTGUARD_SLINKY_SRC    a checkout of github.com/SlinkyProject/slurm-operator
#                            (a work tree at the pinned commit, or a git directory
#                            holding it; default <cache root>/checkouts/slurm-operator)
#   MOUNTGUARD_SLURM_CLIENT_SRC  the same for github.com/SlinkyProject/slurm-client
#                            (default <cache root>/checkouts/slurm-client)
#   GO                       the go command (default: go on PATH, else /usr/local/go/bin/go)
#   GOPROXY                  as usual; the build needs the Go module proxy
set -euo pipefail

# --- pins ---------------------------------------------------------------------
# Slinky operator: v1.2.x is refused by the module proxy ("403 Forbidden: This
# module version is not available", for v1.2.0 to v1.2.3); v1.1.0 is the newest
# release it serves. It serves the same slinky.slurm.net/v1beta1 API.
SLINKY_VERSION=v1.1.0
# Slinky operator from checkouts: the release and the commits its tags name
# (slurm-operator v1.2.1 requires slurm-client v1.2.1 in its go.mod).
SLINKY_SRC_VERSION=v1.2.1
SLINKY_SRC_COMMIT=87313dac23e95f5632439e99c9fe9e325ece1bcd
SLURM_CLIENT_SRC_COMMIT=718b4eccd1f86b73ea90b6da7ea05a7782c02c83
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE=3
SLINKY_SRC_RECIPE=1
# ------------------------------------------------------------------------------

log() { printf '==> %s\n' "$*" >&2; }

# The first <n> lines of a Go build's error file <file> (without its
# download lines), as SKIPPED: lines on stderr.
skipped_lines() { grep -v '^go: downloading' "$1" | head -n "$2" | sed 's/^/SKIPPED:   /' >&2; }

GO="${GO:-}"
if [ -z "$GO" ]; then
    if command -v go >/dev/null 2>&1; then GO=go
    elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
    else echo "error: no Go toolchain (go on PATH or /usr/local/go/bin/go); install Go >= 1.26.1" >&2; exit 1
    fi
fi
go_version="$("$GO" env GOVERSION)"
# K8S_VERSION, ETCD_VERSION, SKEW_KUBELETS, k8s_module, k8s_ldflags.
# shellcheck source=scripts/k8s-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-module.sh"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# fakecri (scripts/fakecri/main.go, a program of ours): the fake CRI runtime
# the real kubelets run on, built inside the kubelet's module (same k8s.io/*
# versions) on its own key, so a change to it rebuilds only it.
fakecri_src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fakecri/main.go"
[ -f "$fakecri_src" ] || { echo "error: $fakecri_src is missing" >&2; exit 1; }
fakecri_sha="$(sha256sum "$fakecri_src" | cut -c1-16)"

# Builds fakecri into <dir>/bin from the Kubernetes module in <dir>/src/k8s
# unless <dir>/fakecri.sha says the binary there is from this source.
build_fakecri() {
    local dir="$1"
    if [ "$(cat "$dir/fakecri.sha" 2>/dev/null)" = "$fakecri_sha" ] && [ -x "$dir/bin/fakecri" ]; then
        return 0
    fi
    log "building fakecri ($fakecri_sha)"
    mkdir -p "$dir/src/k8s/fakecri"
    cp "$fakecri_src" "$dir/src/k8s/fakecri/main.go"
    (cd "$dir/src/k8s" && nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$dir/bin/fakecri.new" ./fakecri)
    mv "$dir/bin/fakecri.new" "$dir/bin/fakecri"
    echo "$fakecri_sha" > "$dir/fakecri.sha"
}

root="${MOUNTGUARD_UPSTREAM_DIR:-$HOME/.cache/mountguard-upstream}"
mkdir -p "$root"
# One build at a time: a second run would remove the first's .partial
# directories under it. It waits for the first, then finds its result.
exec 9>"$root/.upstream.lock"
flock 9

# --- Slinky operator from checkouts -------------------------------------------
# The module proxy refuses slurm-operator v1.2.x and slurm-client, so the
# manager is built from local checkouts of both repositories (a user clones
# them; nothing of theirs is committed here). Each checkout is a work tree
# whose HEAD is the pinned commit, or a git directory (bare or not) that
# holds the pinned commit (and, if it has the tag, the tag names that
# commit). The tree of the pinned commit is taken with `git archive` (local
# changes in a work tree are not built), slurm-client replaces the
# operator's requirement with a `replace` directive, and every other
# dependency comes from the module proxy as usual. The result is cached on
# its own key; nothing else waits on it. A missing or wrong checkout, or a
# failed build, prints SKIPPED: with the reason and builds nothing.

# Prints the git directory to archive <commit> from, or an error on stderr.
checkout_git_dir() {
    local what="$1" src="$2" commit="$3" var="$4"
    if [ ! -e "$src" ]; then
        echo "no checkout of $what at $src (clone it, or set $var to one)" >&2
        return 1
    fi
    local gd
    if ! gd="$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null)"; then
        echo "$src is not a git checkout of $what (set $var to a clone of it)" >&2
        return 1
    fi
    if [ "$(git -C "$src" rev-parse --is-bare-repository)" = false ] \
        && [ "$(git -C "$src" rev-parse --is-inside-work-tree 2>/dev/null)" = true ]; then
        local head
        head="$(git -C "$src" rev-parse HEAD)"
        if [ "$head" != "$commit" ]; then
            echo "the checkout of $what at $src is at commit $head, not the pinned $SLINKY_SRC_VERSION ($commit): run git -C $src checkout $SLINKY_SRC_VERSION" >&2
            return 1
        fi
    elif ! git --git-dir="$gd" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "the git directory $src does not hold the pinned $SLINKY_SRC_VERSION commit $commit of $what (git --git-dir=$src fetch --tags)" >&2
        return 1
    fi
    local tagged
    if tagged="$(git --git-dir="$gd" rev-parse -q --verify "refs/tags/$SLINKY_SRC_VERSION^{commit}" 2>/dev/null)" \
        && [ "$tagged" != "$commit" ]; then
        echo "in $src the tag $SLINKY_SRC_VERSION of $what names $tagged, not the pinned $commit: refusing it" >&2
        return 1
    fi
    echo "$gd"
}

# Builds (or finds cached) the operator; prints `slinky-operator-dir: <dir>`.
slinky_from_checkouts() {
    local op_src="${MOUNTGUARD_SLINKY_SRC:-$root/checkouts/slurm-operator}"
    local cl_src="${MOUNTGUARD_SLURM_CLIENT_SRC:-$root/checkouts/slurm-client}"
    local op_git cl_git
    local skipped="SKIPPED: the Slinky operator $SLINKY_SRC_VERSION from checkouts (the real_operator_* tests)"
    if ! op_git="$(checkout_git_dir github.com/SlinkyProject/slurm-operator "$op_src" "$SLINKY_SRC_COMMIT" MOUNTGUARD_SLINKY_SRC 2>&1)"; then
        echo "$skipped: $op_git" >&2
        return 0
    fi
    if ! cl_git="$(checkout_git_dir github.com/SlinkyProject/slurm-client "$cl_src" "$SLURM_CLIENT_SRC_COMMIT" MOUNTGUARD_SLURM_CLIENT_SRC 2>&1)"; then
        echo "$skipped: $cl_git" >&2
        return 0
    fi
    local dir="$root/slinky-src-${SLINKY_SRC_VERSION}_${SLINKY_SRC_COMMIT:0:12}_${SLURM_CLIENT_SRC_COMMIT:0:12}_${go_version}_r${SLINKY_SRC_RECIPE}"
    if [ ! -f "$dir/complete" ]; then
        log "building the Slinky operator $SLINKY_SRC_VERSION (cmd/manager) from $op_src and $cl_src"
        local t0=$SECONDS
        rm -rf "$dir.partial"
        mkdir -p "$dir.partial/bin" "$dir.partial/crds" "$dir.partial/rbac" "$dir.partial/src/slurm-operator" "$dir.partial/src/slurm-client"
        git --git-dir="$op_git" archive "$SLINKY_SRC_COMMIT" | tar -x -C "$dir.partial/src/slurm-operator"
        git --git-dir="$cl_git" archive "$SLURM_CLIENT_SRC_COMMIT" | tar -x -C "$dir.partial/src/slurm-client"
        if ! (
            cd "$dir.partial/src/slurm-operator"
            "$GO" mod edit -replace github.com/SlinkyProject/slurm-client=../slurm-client
            nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$dir.partial/bin/slurm-operator" ./cmd/manager
        ) 2> "$dir.partial/build.error"; then
            echo "SKIPPED: the Slinky operator $SLINKY_SRC_VERSION from checkouts did not build:" >&2
            skipped_lines "$dir.partial/build.error" 8
            return 0
        fi
        cp "$dir.partial/src/slurm-operator"/config/crd/bases/*.yaml "$dir.partial/crds/"
        cp "$dir.partial/src/slurm-operator/helm/slurm-operator/files/operator_rbac_rules.yaml" "$dir.partial/rbac/"
        cat > "$dir.partial/versions.txt" <<EOF
github.com/SlinkyProject/slurm-operator $SLINKY_SRC_VERSION $SLINKY_SRC_COMMIT (from $op_src)
github.com/SlinkyProject/slurm-client $SLINKY_SRC_VERSION $SLURM_CLIENT_SRC_COMMIT (from $cl_src)
$go_version
EOF
        rm -rf "$dir.partial/src" "$dir.partial/build.error"
        touch "$dir.partial/complete"
        rm -rf "$dir"
        mv "$dir.partial" "$dir"
        log "Slinky operator built in $((SECONDS - t0)) s"
    else
        log "Slinky operator $SLINKY_SRC_VERSION from checkouts cached in $dir"
    fi
    echo "slinky-operator-dir: $dir"
}
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kubelets-$(echo "$SKEW_KUBELETS" | tr ' ' -)_slinky-${SLINKY_VERSION}_${go_version}_r${RECIPE}"
out="$root/$key"
if [ -f "$out/complete" ]; then
    log "upstream programs cached in $out"
    build_fakecri "$out"
    for e in "$out"/*.error; do
        [ -f "$e" ] || continue
        echo "SKIPPED: $(basename "$e" .error) was not built with these pins:" >&2
        skipped_lines "$e" 6
    done
    slinky_from_checkouts
    echo "$out/bin"
    exit 0
fi

rm -rf "$out.partial"
mkdir -p "$out.partial/bin" "$out.partial/crds" "$out.partial/src/k8s" "$out.partial/src/slinky"
start=$SECONDS

# --- Kubernetes + etcd: one module, one `go build` (k8s_module) --------------
staging_version="v0.${K8S_VERSION#v1.}"
k8s_module "$K8S_VERSION" "$out.partial/src/k8s" "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
ldflags="$(k8s_ldflags "$K8S_VERSION")"
log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet $K8S_VERSION and etcd $ETCD_VERSION"
(
    cd "$out.partial/src/k8s"
    nice -n 10 "$GO" build -trimpath -ldflags "$ldflags" -o "$out.partial/bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubelet
    nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$out.partial/bin/etcd" go.etcd.io/etcd/server/v3
)
for v in $SKEW_KUBELETS; do
    log "building kubelet $v (skew window)"
    k8s_module "$v" "$out.partial/src/kubelet-$v"
    (cd "$out.partial/src/kubelet-$v" && nice -n 10 "$GO" build -trimpath -ldflags "$(k8s_ldflags "$v")" \
        -o "$out.partial/bin/kubelet-$v" k8s.io/kubernetes/cmd/kubelet)
done

# --- Slinky operator: its own module (its own k8s.io/* versions) -------------
# The CRDs come from the operator's module alone; building cmd/manager also
# needs its dependencies (github.com/SlinkyProject/slurm-client among them).
# A failed operator build is recorded in slurm-operator.error and reported
# loudly; the CRDs and the other programs stay usable.
log "fetching github.com/SlinkyProject/slurm-operator@$SLINKY_VERSION (CRDs, cmd/manager)"
cat > "$out.partial/src/slinky/go.mod" <<EOF
module mountguard.invalid/upstream-slinky

go 1.26.1

require github.com/SlinkyProject/slurm-operator $SLINKY_VERSION
EOF
slinky_dir="$("$GO" mod download -json "github.com/SlinkyProject/slurm-operator@$SLINKY_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$slinky_dir/config/crd/bases" ] || { echo "error: no CRDs in github.com/SlinkyProject/slurm-operator@$SLINKY_VERSION" >&2; exit 1; }
cp "$slinky_dir"/config/crd/bases/*.yaml "$out.partial/crds/"
chmod u+w "$out.partial/crds/"*.yaml
if ! (
    cd "$out.partial/src/slinky"
    nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$out.partial/bin/slurm-operator" \
        github.com/SlinkyProject/slurm-operator/cmd/manager
) 2> "$out.partial/slurm-operator.error"; then
    echo "SKIPPED: the Slinky operator (cmd/manager) could not be built:" >&2
    skipped_lines "$out.partial/slurm-operator.error" 6
else
    rm -f "$out.partial/slurm-operator.error"
fi

cat > "$out.partial/versions.txt" <<EOF
k8s.io/kubernetes $K8S_VERSION (staging modules $staging_version)
kubelets of the skew window: $SKEW_KUBELETS
go.etcd.io/etcd/server/v3 $ETCD_VERSION
github.com/SlinkyProject/slurm-operator $SLINKY_VERSION
$go_version
EOF
build_fakecri "$out.partial"
log "built in $((SECONDS - start)) s; $(du -sh "$out.partial/bin" | cut -f1) of binaries"
touch "$out.partial/complete"
rm -rf "$out"
mv "$out.partial" "$out"
slinky_from_checkouts
echo "$out/bin"
