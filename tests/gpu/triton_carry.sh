#!/usr/bin/env bash
# Packs the tritonserver of .deps/pytriton (scripts/deps.sh) for the GPU machine, small
# enough to carry (about 24 MB): pytriton/tritonserver (bin, backends, caches; not the
# Python backend's stubs) and the libraries it links (nvidia_pytriton.libs, less those
# tritonserver never loads: libacl, libarchive, libbz2, liblz4, libpython3). Two minutes
# of xz -9.
#   bash tests/gpu/triton_carry.sh OUT.tar.xz
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "$1")
src=$root/.deps/pytriton
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/pytriton"
cp -r "$src/pytriton/tritonserver" "$tmp/pytriton/"
rm -rf "$tmp/pytriton/tritonserver/python_backend_stubs" "$tmp/pytriton/tritonserver/backends/python"
cp -r "$src/nvidia_pytriton.libs" "$tmp/"
rm -f "$tmp"/nvidia_pytriton.libs/{libacl,libarchive,libbz2,liblz4,libpython3}-*
if ldd "$tmp/pytriton/tritonserver/bin/tritonserver" | grep -q "not found"; then
  echo "triton_carry: tritonserver misses a library:" >&2
  ldd "$tmp/pytriton/tritonserver/bin/tritonserver" | grep "not found" >&2
  exit 1
fi
(cd "$tmp" && XZ_OPT=-9 tar cJf "$out" pytriton nvidia_pytriton.libs)
du -h "$out"
