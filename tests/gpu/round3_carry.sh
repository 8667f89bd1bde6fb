#!/usr/bin/env bash
# Prepares OUT (default .carry/round3, ignored by git) for tests/gpu/round3_check.sh, here
# on the build machine (no GPU or nvcc needed; two or three minutes on two cores):
#   new/   this tree's cudatest (the bridge/cuda test binary), austentest (demo/austen's),
#          gpubench, arbench and gollm-gpucheck (for check.py)
#   base/  BASE's gpubench (its own ABI: a library of another ABI refuses this tree's) and
#          BASE's cuda/ (built into the A/B's base library on the GPU machine)
#   commit this tree's and BASE's commits
# packed into OUT/bins.tar.xz; and, so that the check runs from a device call that sends
# another checkout (the lead's main), OUT/overlay.tar.xz — every file this tree changed or
# added since BASE — and OUT/run.sh, which lays BASE's checkout (the call's working tree)
# and the overlay into /tmp/gollm-round3/tree once per commit and runs the check there:
#   [R3_LIBS=DIR] bash tests/gpu/round3_carry.sh [OUT] [BASE]   # BASE default ae32bb3
# then on the GPU machine, from the repository root, carrying OUT:
#   R3_STAGES="..." bash .carry/round3/run.sh $OUT
# (or, from a checkout of this tree itself: bash tests/gpu/round3_check.sh .carry/round3 $OUT).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/round3} base=${2:-ae32bb3}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/new" "$stage/base" "$stage/base-tree"
go test -c -trimpath -o "$stage/new/cudatest" ./bridge/cuda
go test -c -trimpath -o "$stage/new/austentest" ./demo/austen
go build -trimpath -ldflags=-s -o "$stage/new/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$stage/new/arbench" ./bench/arbench
go build -trimpath -ldflags=-s -o "$stage/new/gollm-gpucheck" ./cmd/gollm-gpucheck
# The base's tree from git itself (no worktree of the shared repository is added).
git archive "$base" | tar x -C "$stage/base-tree"
(cd "$stage/base-tree" && go build -trimpath -ldflags=-s -o "$stage/base/gpubench" ./bench/gpubench)
cp -r "$stage/base-tree/cuda" "$stage/base/cuda"
{
  echo "new $(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge model engine engines bench cmd demo tests/gpu | grep -q . && echo ' (dirty)')"
  echo "base $(git rev-parse --short "$base")"
} > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" new base commit)
# Libraries built elsewhere from exactly these sources (R3_LIBS: a folder with new.so and
# base.so, from tests/gpu/build_lib.sh with a local nvcc, say): the GPU machine then builds
# neither.
rm -rf "$out/libs"
if [ -n "${R3_LIBS:-}" ]; then
  mkdir -p "$out/libs"
  for v in new base; do xz -T2 -6 -c "$R3_LIBS/$v.so" > "$out/libs/$v.so.xz"; done
  cp "$stage/commit" "$out/libs/commit"
fi
# The overlay: this tree's version of every file that differs from the base (committed or
# not), and the paths the base has that this tree deleted.
{ git diff --name-only --diff-filter=d "$base"; git ls-files --others --exclude-standard; } | sort -u |
  grep -v '^\.carry/' > "$stage/changed"
git diff --name-only --diff-filter=D "$base" > "$out/deleted.txt"
tar cJf "$out/overlay.tar.xz" -T "$stage/changed"
cp "$stage/commit" "$out/commit"
cat > "$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Made by tests/gpu/round3_carry.sh: runs tests/gpu/round3_check.sh from the base's
# checkout (the call's working tree, $PWD) with the carry's overlay laid over it, in
# /tmp/gollm-round3/tree (kept, with its build/round3/, while the machine stays warm).
#   [R3_STAGES=...] bash .carry/round3/run.sh OUTDIR
set -uo pipefail
c=$(cd "$(dirname "$0")" && pwd) t=/tmp/gollm-round3/tree
if ! cmp -s "$c/commit" "$t/.round3-commit" 2> /dev/null; then
  keep=$(mktemp -d)
  [ -d "$t/build/round3" ] && mv "$t/build/round3" "$keep/"
  rm -rf "$t" && mkdir -p "$t"
  tar cf - --exclude=./.carry --exclude=./build --exclude=./.deps --exclude=./.git . | tar xf - -C "$t"
  tar xJf "$c/overlay.tar.xz" -C "$t"
  (cd "$t" && xargs -r rm -f < "$c/deleted.txt")
  # Libraries built for another commit are not reused (round3_check.sh checks the commit).
  mkdir -p "$t/build" && [ -d "$keep/round3" ] && mv "$keep/round3" "$t/build/"
  cp "$c/commit" "$t/.round3-commit"
fi
exec bash "$t/tests/gpu/round3_check.sh" "$c" "$1"
EOF
cat "$stage/commit"
du -sh "$out"/*
