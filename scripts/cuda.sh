#!/usr/bin/env bash
# Prints 1 if the CUDA engine (cuda/ → libgollm_cuda.so, and the CUDA wheels its compiler
# comes from) is to be built, else 0. GOLLM_CUDA decides: 1 always, 0 never, auto (or
# unset) only where an NVIDIA driver is present — /proc/driver/nvidia, which the kernel
# module creates, or nvidia-smi on the PATH — so that a CPU-only machine neither
# downloads 839 MB of wheels nor compiles kernels for GPUs it does not have.
set -euo pipefail
case "${GOLLM_CUDA:-auto}" in
  1 | on | ON) echo 1 ;;
  0 | off | OFF) echo 0 ;;
  auto | AUTO)
    if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; then echo 1; else echo 0; fi ;;
  *) echo "GOLLM_CUDA=$GOLLM_CUDA: want 1, 0 or auto" >&2; exit 2 ;;
esac
