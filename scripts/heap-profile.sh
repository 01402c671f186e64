#!/usr/bin/env bash
# Where the controller's heap goes, by allocation site: runs the heap
# benchmark (controller-shim/benches/heap.rs, the live evaluation task
# only) under heaptrack and prints the bytes live at the peak, grouped by
# the innermost controller function that allocated them.
#
#   bash scripts/heap-profile.sh                 # 1,000 nodes x 110 pods
#   bash scripts/heap-profile.sh --nodes 5000 --pods 30
#
# Needs heaptrack (Debian package `heaptrack`; installed here when run as
# root). The figures per pod scale linearly with the cluster size; the
# benchmark alone (`cargo bench -p mountguard-controller --bench heap`)
# prints the same state by structure without heaptrack.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v heaptrack >/dev/null || ! command -v heaptrack_print >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends heaptrack >/dev/null
    else
        echo "error: heaptrack is not installed (Debian: apt-get install heaptrack)" >&2
        exit 1
    fi
fi

args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--nodes 1000 --pods 110)

bin=$(cargo bench -p mountguard-controller --bench heap --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "heap" and m.get("executable"):
        print(m["executable"])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
heaptrack -o "$out/heap" "$bin" "${args[@]}" live | grep -v '^heaptrack\|^starting\|^/usr/lib'
heaptrack_print -f "$out/heap.zst" --flamegraph-cost-type peak -F "$out/stacks.txt" >/dev/null
pods=$(python3 - "${args[@]}" <<'EOF'
import sys
a = sys.argv[1:]
get = lambda k, d: int(a[a.index(k) + 1]) if k in a else d
print(get("--nodes", 5000) * get("--pods", 110))
EOF
)
python3 - "$out/stacks.txt" "$pods" <<'EOF'
# Folded stacks (root first), each ending in the bytes live at the peak.
# Each stack is charged to its innermost frame in the controller's own
# sources (generic std/alloc helpers are skipped).
import collections, re, sys
ours = re.compile(r"^(\S+) \((model|index|eval|verdict|projection|fingerprint|status|events|metrics|convert|report|rollout|testkit)\.rs\)$")
totals = collections.Counter()
for line in open(sys.argv[1]):
    stack, _, cost = line.rstrip("\n").rpartition(" ")
    if not cost.isdigit() or int(cost) == 0:
        continue
    site = "(outside the controller)"
    frames = [ours.match(f) for f in reversed(stack.split(";"))]
    frames = [m for m in frames if m and not m.group(1).endswith("<>")]
    if frames:
        # A closure is named after the function around it.
        name = frames[0].group(1)
        outer = next((m.group(1) for m in frames[1:] if not m.group(1).startswith("{")), None)
        if name.startswith("{") and outer:
            name = f"{outer}::{name}"
        site = f"{frames[0].group(2)}.rs {name}"
    totals[site] += int(cost)
pods = int(sys.argv[2])
total = sum(totals.values())
print(f"\nheap live at the peak by allocation site ({total / 2**20:.1f} MiB, {pods} pods):")
for site, b in totals.most_common(25):
    print(f"  {b / 2**20:8.1f} MiB {b / pods:7.1f} B/pod  {site}")
EOF
