#!/usr/bin/env bash
# Builds the programs of the real-node tier that scripts/upstream.sh does not:
# the container runtime (containerd, its runc shim and ctr; runc, with cgo
# and libseccomp), kube-proxy and kubectl (the same Kubernetes release and
# module recipe as upstream.sh's kubelet), the Helm CLI (Helm 4 as `helm`, Helm 3 as
# `helm3`), CoreDNS (the cluster DNS) and kube-router (its network policy
# controller is the tier's NetworkPolicy engine), each pinned, from the Go
# module proxy, into the same cache (nothing of upstream's committed):
#
#   bash scripts/node-tools.sh     # build what is missing; last stdout line: the bin dir
#
# runc needs a C compiler and libseccomp's headers (Debian: gcc,
# libseccomp-dev, pkg-config).
#
# Environment: MOUNTGUARD_UPSTREAM_DIR (default ~/.cache/mountguard-upstream), GO.
set -euo pipefail
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
HELM_VERSION=v4.3.2       # `helm`, every test
HELM3_VERSION=v3.21.4     # `helm3`, the Helm 3 install/upgrade/uninstall test
# The NetworkPolicy engine. Not sigs.k8s.io/kube-network-policies (v0.8.0):
# it hands packets to userspace with nftables' `queue` statement, which a
# kernel without CONFIG_NFT_QUEUE refuses (docs/testing.md, "NetworkPolicy").
KUBE_ROUTER_VERSION=v2.1.0
COREDNS_VERSION=v1.15.0
RECIPE=2

log() { printf '==> %s\n' "$*" >&2; }
GO="${GO:-}"
if [ -z "$GO" ]; then
    if command -v go >/dev/null 2>&1; then GO=go
    elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
    else echo "error: no Go toolchain (go on PATH or /usr/local/go/bin/go)" >&2; exit 1
    fi
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# K8S_VERSION, ETCD_VERSION, k8s_module, k8s_ldflags: scripts/upstream.sh's.
# shellcheck source=scripts/k8s-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-module.sh"
root="${MOUNTGUARD_UPSTREAM_DIR:-$HOME/.cache/mountguard-upstream}"
out="$root/node-tools_k8s-${K8S_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_helm-${HELM_VERSION}-${HELM3_VERSION}_$("$GO" env GOVERSION)_r${RECIPE}"
mkdir -p "$out/bin" "$out/src"
# The cache's lock, the one scripts/upstream.sh takes: two runs at once (the
# test suite and scripts/local-cluster.sh, say) build one after the other,
# never into the same *.new file.
exec 9>"$root/.upstream.lock"
flock 9

# kube-proxy and kubectl: the module scripts/upstream.sh writes (k8s_module:
# same go.mod, so the Go build cache it filled is reused). kubectl runs the
# user docs' commands against the tier's install (docs_commands.rs).
k8s_binary() { # name
    [ -x "$out/bin/$1" ] && return 0
    log "building $1 $K8S_VERSION"
    local start=$SECONDS ldflags
    k8s_module "$K8S_VERSION" "$out/src/k8s" "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    ldflags="$(k8s_ldflags "$K8S_VERSION")"
    (cd "$out/src/k8s" && nice -n 10 "$GO" build -trimpath -ldflags "$ldflags" \
        -o "$out/bin/$1.new" "k8s.io/kubernetes/cmd/$1")
    mv "$out/bin/$1.new" "$out/bin/$1"
    log "$1 built in $((SECONDS - start)) s"
}
k8s_binary kubectl
k8s_binary kube-proxy

# A program from a module of its own:
#   build_module NAME MODULE VERSION PACKAGE LDFLAGS [TAGS]
# (CGO_ENABLED=0 unless the caller's environment says otherwise.)
build_module() {
    local name="$1" module="$2" version="$3" pkg="$4" ldflags="$5" tags="${6:-}"
    [ -x "$out/bin/$name" ] && return 0
    log "building $name ($module $version${tags:+, tags $tags})"
    local start=$SECONDS
    mkdir -p "$out/src/$name"
    printf 'module mountguard.invalid/upstream-%s\n\ngo 1.25\n\nrequire %s %s\n' \
        "$name" "$module" "$version" > "$out/src/$name/go.mod"
    (cd "$out/src/$name" && nice -n 10 "$GO" build -trimpath -tags "$tags" -ldflags "$ldflags" \
        -o "$out/bin/$name.new" "$pkg")
    mv "$out/bin/$name.new" "$out/bin/$name"
    log "$name built in $((SECONDS - start)) s"
}

# containerd as its Makefile builds it, without cgo: its tags
# (urfave_cli_no_docs; no_grpc for the shim) plus the snapshotters the rig
# does not use left out (BUILDING.md: no_btrfs, no_devmapper, no_zfs; btrfs
# needs cgo anyway), the version stamped into version.Version.
ctrd=github.com/containerd/containerd/v2
ctrd_ldflags="-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION"
ctrd_tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
build_module containerd "$ctrd" "$CONTAINERD_VERSION" "$ctrd/cmd/containerd" "$ctrd_ldflags" "$ctrd_tags"
build_module ctr "$ctrd" "$CONTAINERD_VERSION" "$ctrd/cmd/ctr" "$ctrd_ldflags" "$ctrd_tags"
build_module containerd-shim-runc-v2 "$ctrd" "$CONTAINERD_VERSION" "$ctrd/cmd/containerd-shim-runc-v2" \
    "$ctrd_ldflags" "$ctrd_tags no_grpc"
# runc as its Makefile builds it (cgo, seccomp; its version from the
# module's VERSION file), without the optional libpathrs (a Rust library
# no distribution here packages; runc then uses its Go path-safety code).
CGO_ENABLED=1 build_module runc github.com/opencontainers/runc "$RUNC_VERSION" \
    github.com/opencontainers/runc "-s -w" "seccomp urfave_cli_no_docs"
build_module helm helm.sh/helm/v4 "$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
    "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
build_module helm3 helm.sh/helm/v3 "$HELM3_VERSION" helm.sh/helm/v3/cmd/helm \
    "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
build_module kube-router github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
    "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
"$out/bin/containerd" --version >&2
"$out/bin/runc" --version | head -n 1 >&2
"$out/bin/helm" version --short >&2
"$out/bin/helm3" version --short >&2

# CoreDNS with only the plugins the rig's Corefile uses
# (tests/src/real/services.rs): a main package of our own, as CoreDNS's
# coredns.go is (import the plugins, then coremain.Run), with the plugins
# that core/plugin/zplugin.go would import all of narrowed to these, and
# dnsserver.SetDirectives (core/dnsserver/directives.go) given them in the
# order of plugin.cfg (generated into core/dnsserver/zdirectives.go, which
# decides their order in the chain). Its version is not in the cache dir's
# name: a binary that reports another version is built again.
if ! "$out/bin/coredns" -version 2>/dev/null | grep -qx "CoreDNS-${COREDNS_VERSION#v}"; then
    log "building coredns $COREDNS_VERSION"
    start=$SECONDS
    plugins=(bind ready errors log kubernetes)   # in plugin.cfg's order
    coredns_gomod="$("$GO" mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    mkdir -p "$out/src/coredns"
    cat > "$out/src/coredns/go.mod" <<EOF
module mountguard.invalid/upstream-coredns

go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$coredns_gomod")

require github.com/coredns/coredns $COREDNS_VERSION
EOF
    {
        printf 'package main\n\nimport (\n'
        printf '\t"github.com/coredns/coredns/core/dnsserver"\n'
        printf '\t"github.com/coredns/coredns/coremain"\n'
        printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "${plugins[@]}"
        printf ')\n\nfunc main() {\n\tif err := dnsserver.SetDirectives([]string{'
        printf '"%s", ' "${plugins[@]}"
        printf '}); err != nil {\n\t\tpanic(err)\n\t}\n\tcoremain.Run()\n}\n'
    } > "$out/src/coredns/main.go"
    (cd "$out/src/coredns" && nice -n 10 "$GO" build -trimpath -ldflags "-s -w" \
        -o "$out/bin/coredns.new" .)
    mv "$out/bin/coredns.new" "$out/bin/coredns"
    log "coredns built in $((SECONDS - start)) s"
fi
log "$("$out/bin/coredns" -version | head -n 1), plugins: $("$out/bin/coredns" -plugins | xargs)"
echo "$out/bin"
