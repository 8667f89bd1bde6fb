#!/usr/bin/env bash
# Speculative decoding (issue 36) on one GPU, in a few minutes:
#   bash tests/gpu/spec_check.sh .carry/spec OUTDIR [TARGET DRAFT]
# after tests/gpu/spec_carry.sh here. Prints PASS or FAIL for each check and exits 1 when
# one failed:
#   verify   TestGPUSpeculationKeepsGreedyOutput: on the GPT-2 and LLaMA fixtures (fp16),
#            prompt lookup and the model as its own draft (a second GPU engine) give the
#            greedy tokens of decoding without speculation, proposals made and accepted
#            (the rows computed on the GPU, the acceptance on the host);
#            TestProposalsComeBackAsRowsAndAreVerifiedOnTheHost (no GPU needed)
#   bench    bench/specbench -engine gpu: the Austen model (or TARGET with its DRAFT, the
#            trained pair of demo/austen/README.md) — prompt lookup on a prompt the answer
#            copies from and on a short one at batch 1, the draft model at batch 1, prompt
#            lookup at batch 64 — speculation off and on alternating, 7 rounds; the rows go
#            to OUTDIR/<date>-speculative-gpu.jsonl.
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
target=${3:-model_repository/austen/1} draft=${4:-${3:-model_repository/austen/1}}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
mkdir -p "$out"
out=$(cd "$out" && pwd)
export GOLLM_CUDA_LIB="$carry/libgollm_cuda.so"
fails=0
check() {
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
check verify "(cd '$root/bridge/cuda' && timeout 300 '$carry/cudatest' -test.count=1 -test.v \
  -test.run 'TestGPUSpeculationKeepsGreedyOutput|TestProposalsComeBackAsRowsAndAreVerifiedOnTheHost' \
  > '$out/spec-verify.log' 2>&1) && ! grep -q -- '--- SKIP' '$out/spec-verify.log'"
grep -E 'proposals accepted|^(---|ok|FAIL)' "$out/spec-verify.log"
check bench "(cd '$root' && timeout 400 '$carry/specbench' -engine gpu -rounds 7 -model '$target' -draft '$draft' \
  -out '$out' > '$out/spec-bench.log' 2>&1)"
grep -v ' round ' "$out/spec-bench.log"
echo "$fails failed"
[ "$fails" = 0 ]
