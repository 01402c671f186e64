#!/usr/bin/env bash
# Builds Slurm (slurmctld, slurmd, slurmstepd, slurmrestd, scontrol, sinfo,
# srun, sbatch) from a local clone of SchedMD's public repository, pinned to
# one release tag, into the upstream cache beside the other programs the
# real tiers run. Nothing of Slurm's is committed: the tree of the pinned
# commit is taken with `git archive` and built in the cache.
#
#   bash scripts/slurm.sh        # build if needed; last stdout line: the install prefix
#
# Without a clone, or with one that does not hold the pinned tag, or without
# the Debian packages it links with (and no root to install them), it prints
# a line `SKIPPED: Slurm <tag>: <reason>` on stderr and exits 3; the tests
# that need Slurm then say SKIPPED with that reason. A build that fails is an
# error (exit 1, the end of the build log on stderr), never a skip.
#
# Environment:
#   MOUNTGUARD_UPSTREAM_DIR  cache root (default ~/.cache/mountguard-upstream)
#   MOUNTGUARD_SLURM_SRC     a clone of github.com/SchedMD/slurm (a work tree at the
#                            pinned tag, or a git directory holding it; default
#                            <cache root>/checkouts/slurm)
set -euo pipefail

# --- pins ---------------------------------------------------------------------
# The Slurm release the Slinky operator v1.2 images ship (26.05), at its
# newest tag, and the commit that tag names.
SLURM_TAG=slurm-26-05-3-1
SLURM_COMMIT=56fe867884038ba2074bd414075b60c2fb1d68bb
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE=1
# ------------------------------------------------------------------------------

log() { printf '==> %s\n' "$*" >&2; }
skip() { printf 'SKIPPED: Slurm %s: %s\n' "$SLURM_TAG" "$*" >&2; exit 3; }

root="${MOUNTGUARD_UPSTREAM_DIR:-$HOME/.cache/mountguard-upstream}"
src="${MOUNTGUARD_SLURM_SRC:-$root/checkouts/slurm}"
prefix="$root/slurm-${SLURM_TAG#slurm-}_r${RECIPE}"
mkdir -p "$root"

# The tiers run slurmctld as SlurmUser `slurm` (the user of the Slinky
# images); slurmrestd runs as `nobody` (it refuses root and SlurmUser).
if ! id -u slurm >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || skip "needs a user slurm (run as root, or: useradd --system slurm)"
    useradd --system --no-create-home --shell /usr/sbin/nologin slurm \
        || skip "useradd --system slurm failed"
fi

if [ -x "$prefix/sbin/slurmctld" ] && [ -f "$prefix/.complete" ]; then
    echo "$prefix"
    exit 0
fi

# The packages the build links with (docs/testing.md, "Slurm"): auth/slurm is
# built only with JWT (libjwt), slurmrestd only with http-parser and json-c.
packages=(build-essential pkg-config libssl-dev libjwt-dev libjson-c-dev libhttp-parser-dev libyaml-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || skip "needs Debian packages ${missing[*]} (run as root or install them)"
    log "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || skip "apt-get install ${missing[*]} failed"
fi

[ -e "$src" ] || skip "no clone of github.com/SchedMD/slurm at $src (clone it and check out $SLURM_TAG, or set MOUNTGUARD_SLURM_SRC)"
gd="$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null)" \
    || skip "$src is not a git clone of github.com/SchedMD/slurm (set MOUNTGUARD_SLURM_SRC)"
if [ "$(git -C "$src" rev-parse --is-bare-repository)" = false ] \
    && [ "$(git -C "$src" rev-parse --is-inside-work-tree 2>/dev/null)" = true ]; then
    head="$(git -C "$src" rev-parse HEAD)"
    [ "$head" = "$SLURM_COMMIT" ] \
        || skip "the clone at $src is at $head, not $SLURM_TAG ($SLURM_COMMIT): run git -C $src checkout $SLURM_TAG"
elif ! git --git-dir="$gd" cat-file -e "$SLURM_COMMIT^{commit}" 2>/dev/null; then
    skip "the git directory $src does not hold $SLURM_TAG ($SLURM_COMMIT): git --git-dir=$src fetch --tags"
fi
if tagged="$(git --git-dir="$gd" rev-parse -q --verify "refs/tags/$SLURM_TAG^{commit}" 2>/dev/null)" \
    && [ "$tagged" != "$SLURM_COMMIT" ]; then
    skip "in $src the tag $SLURM_TAG names $tagged, not the pinned $SLURM_COMMIT: refusing it"
fi

# One build at a time in the cache (the lock scripts/upstream.sh takes).
exec 9>"$root/.upstream.lock"
flock 9
if [ -x "$prefix/sbin/slurmctld" ] && [ -f "$prefix/.complete" ]; then
    echo "$prefix"
    exit 0
fi

log "building Slurm $SLURM_TAG from $src"
start=$SECONDS
work="$root/slurm-build.partial"
rm -rf "$work" "$prefix"
mkdir -p "$work"
git --git-dir="$gd" archive "$SLURM_COMMIT" | tar -x -C "$work"
build_log="$work/build.log"
(
    cd "$work"
    # Only what the tiers use: auth/slurm with JWT, no munge, no plugins that
    # need hardware or libraries the rig does not have.
    ./configure --prefix="$prefix" --sysconfdir="$prefix/etc" \
        --without-munge --with-jwt --with-json --with-yaml \
        --without-pmix --without-ucx --without-hdf5 --without-nvml --without-rsmi \
        --without-oneapi --without-freeipmi --without-rdkafka --without-hwloc \
        --without-lua --without-ofed --disable-x11 --disable-static \
        --enable-multiple-slurmd
    nice -n 10 make -j"$(nproc)"
    make install
) >"$build_log" 2>&1 || {
    tail -n 30 "$build_log" >&2
    echo "error: the Slurm $SLURM_TAG build failed (log: $build_log)" >&2
    exit 1
}
for f in sbin/slurmctld sbin/slurmd sbin/slurmstepd sbin/slurmrestd bin/scontrol bin/sinfo bin/srun bin/sbatch \
    lib/slurm/auth_slurm.so; do
    [ -e "$prefix/$f" ] || { echo "error: the Slurm $SLURM_TAG build did not produce $f (log: $build_log)" >&2; exit 1; }
done
# Without debug sections the install is about a tenth of the size (the rig
# links its plugins into every test's directory).
find "$prefix/bin" "$prefix/sbin" "$prefix/lib" -type f \( -perm -u+x -o -name '*.so*' \) \
    -exec strip --strip-debug {} + 2>/dev/null || true
rm -rf "$work"
touch "$prefix/.complete"
log "Slurm $SLURM_TAG built in $((SECONDS - start)) s into $prefix"
echo "$prefix"
