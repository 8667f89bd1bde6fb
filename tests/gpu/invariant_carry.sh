#!/usr/bin/env bash
# Prepares .carry/invariant (ignored by git) for tests/gpu/invariant_check.sh, here on the
# build machine (no GPU or nvcc needed): tests/gpu/recipe_carry.sh's pack — this tree's
# and the base's gollm-gpucheck and gpubench, this tree's bridge/cuda test binary, the
# base's cuda/ sources — against BASE (default 68cafc8, the commit before batch
# invariance).
#   bash tests/gpu/invariant_carry.sh [BASE]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
exec bash "$root/tests/gpu/recipe_carry.sh" "${1:-68cafc8}" "$root/.carry/invariant"
