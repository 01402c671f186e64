# shellcheck shell=bash
# The Kubernetes pins and the module recipe that scripts/upstream.sh (the
# control plane, the kubelets) and scripts/node-tools.sh (kube-proxy) build
# with: sourced by both, so kube-proxy is the same release, built from the
# same go.mod (the Go build cache the first filled serves the second).
# The caller defines GO (the go command) and log. The pins are read by the
# scripts that source this file.
# shellcheck disable=SC2034

# Kubernetes: the release matching the k8s-openapi feature in Cargo.toml (v1_37).
K8S_VERSION=v1.37.2
# etcd: the release kubernetes v1.37.2's own go.mod requires (go.etcd.io/etcd/server/v3
# v3.7.0). Naming another one here would not build it: Go's minimal version
# selection takes the higher of the two, and the cache key would lie.
ETCD_VERSION=v3.7.0
# The kubelets of the older minors in the supported skew window (a kubelet may
# be up to three minors older than the API server: kubernetes.io/releases/version-skew-policy),
# each the newest patch the Go module proxy serves; built beside the cluster's
# own kubelet as bin/kubelet-<version>. The tests run the kubelet-fidelity
# scenarios on a node of each, in the same cluster.
SKEW_KUBELETS="v1.34.4 v1.35.4 v1.36.3"

# Writes <dir>/go.mod: a module requiring k8s.io/kubernetes <version> (and
# <extra requirement>, if given) with every staging module pinned:
# k8s.io/kubernetes replaces every k8s.io/* staging module with ./staging/...,
# and replace directives of a dependency are ignored, so each one is pinned
# to the matching published v0.x.y (taken from kubernetes' own go.mod at
# the tag).
k8s_module() {
    local version="$1" dir="$2" extra="${3:-}"
    log "resolving k8s.io/kubernetes@$version"
    local gomod
    gomod="$("$GO" mod download -json "k8s.io/kubernetes@$version" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [ -f "$gomod" ] || { echo "error: could not download k8s.io/kubernetes@$version's go.mod" >&2; exit 1; }
    mkdir -p "$dir"
    {
        echo "module mountguard.invalid/upstream-k8s"
        echo
        echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
        echo
        echo "require ("
        echo "    k8s.io/kubernetes $version"
        if [ -n "$extra" ]; then echo "    $extra"; fi
        echo ")"
        echo
        grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$gomod" \
            | awk -v v="v0.${version#v1.}" '{ print "replace " $1 " => " $1 " " v }'
    } > "$dir/go.mod"
}
# The -ldflags that stamp <version> into a Kubernetes binary.
k8s_ldflags() {
    local flags="-s -w" var
    for var in gitVersion=$1 gitMajor=1 gitMinor=$(echo "$1" | cut -d. -f2) gitTreeState=clean; do
        flags="$flags -X k8s.io/component-base/version.$var"
    done
    echo "$flags"
}
