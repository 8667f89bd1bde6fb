# Sourced by tests/gpu's *_check.sh scripts that check a tree's library from a carry: their
# set-up, PASS/FAIL bookkeeping and summary. Not a script of its own.
#
#   check_begin NAME CARRY OUT  root, carry and out (made) as absolute paths; env.sh sourced
#                               (cuBLAS and NCCL on the loader's path); w=/tmp/gollm-NAME with
#                               CARRY's bins.tar.xz unpacked afresh into $w/bin; commit, its
#                               commit file, printed
#   check LABEL CONDITION       CONDITION evaluated; PASS or FAIL LABEL, counted
#   check_library LIB           LIB built from cuda/ (tests/gpu/build_lib.sh, log in
#                               $out/build.log), or PREBUILT_LIB copied there (unless it is
#                               LIB, which a warm machine keeps); checked; exits on failure
#   check_gpu                   each GPU's name, compute capability and memory, into
#                               $out/gpu.txt; machine, the first's name
#   check_end                   the counts and each failed label; status 1 on a failure
check_begin() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  carry=$(cd "$2" && pwd)
  out=$3
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  source "$root/tests/gpu/env.sh"
  w=/tmp/gollm-$1
  rm -rf "$w/bin" && mkdir -p "$w/bin"
  tar xJf "$carry/bins.tar.xz" -C "$w/bin"
  commit=$(cat "$w/bin/commit")
  echo "commit $commit"
  fails=0 checks=0 failed=()
}

check() {
  checks=$((checks + 1))
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); failed+=("$1"); fi
}

check_library() {
  local lib=$1 rc t0=$SECONDS
  mkdir -p "$(dirname "$lib")"
  if [ -n "${PREBUILT_LIB:-}" ]; then
    { [ "$PREBUILT_LIB" -ef "$lib" ] || cp "$PREBUILT_LIB" "$lib"; } && rc=0 || rc=1
    echo "prebuilt $PREBUILT_LIB" > "$out/build.log"
  else
    bash "$root/tests/gpu/build_lib.sh" "$lib" > "$out/build.log" 2>&1
    rc=$?
  fi
  check "libgollm_cuda.so builds ($((SECONDS - t0)) s)" "[ $rc = 0 ]"
  [ $rc = 0 ] || { tail -30 "$out/build.log"; exit 1; }
}

check_gpu() {
  nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader | tee "$out/gpu.txt"
  machine=$(head -1 "$out/gpu.txt" | cut -d, -f1)
}

check_end() {
  echo "$((checks - fails)) passed, $fails failed"
  local f
  for f in "${failed[@]}"; do echo "  failed: $f"; done
  [ "$fails" = 0 ]
}
