#!/usr/bin/env bash
# Prepares OUT (default .carry/recipe, ignored by git) for tests/gpu/recipe_ab.sh, here on
# the build machine (no GPU or nvcc needed; a minute or two): the Go binaries
# gollm-gpucheck and gpubench of this tree (new/) and of the base (base/) — each speaks its
# own library's ABI, so the two libraries cannot share them —, this tree's bridge/cuda test
# binary (new/cudatest, for the GPU Go tests), the base's cuda/ sources
# (base/cuda/, built into its library on the GPU machine), and the commits, packed into
# OUT/bins.tar.xz.
#   bash tests/gpu/recipe_carry.sh [BASE] [OUT]
# BASE is a folder holding the base's checkout (default .carry/base) or a git ref of this
# repository (checked out into a temporary worktree).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
base=${1:-.carry/base} out=${2:-.carry/recipe}
stage=$(mktemp -d)
trap 'rm -rf "$stage"; [ -n "${wt:-}" ] && git worktree remove --force "$wt"' EXIT
if [ -d "$base" ]; then
  bdir=$(cd "$base" && pwd)
else
  wt="$stage/base-tree"
  git worktree add -q --detach "$wt" "$base"
  bdir=$wt
fi
# bins NAME DIR: the Go binaries of the tree in DIR into $stage/NAME.
bins() {
  (cd "$2" && go build -trimpath -ldflags=-s -o "$stage/$1/gollm-gpucheck" ./cmd/gollm-gpucheck &&
    go build -trimpath -ldflags=-s -o "$stage/$1/gpubench" ./bench/gpubench)
}
bins new "$root"
bins base "$bdir"
go test -c -trimpath -o "$stage/new/cudatest" ./bridge/cuda
cp -r "$bdir/cuda" "$stage/base/cuda"
{
  echo "new $(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge model engine | grep -q . && echo ' (dirty)')"
  echo "base $(git -C "$bdir" rev-parse --short HEAD 2> /dev/null || echo "$base")"
} > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-9 tar cJf "$out/bins.tar.xz" new base commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
