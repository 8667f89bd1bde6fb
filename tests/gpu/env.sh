# Sourced on the GPU machine: puts a CUDA 13 cuBLAS on the loader's path for
# libgollm_cuda.so (the one of the PyTorch wheels there, else the system toolkit's).
cublas_dir=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    for base in nvidia.__path__:
        for hit in glob.glob(os.path.join(base, "*", "lib", "libcublas.so.13")):
            print(os.path.dirname(hit)); raise SystemExit
except ImportError:
    pass
PY
)
if [ -z "$cublas_dir" ]; then
  hit=$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2>/dev/null | head -1)
  [ -n "$hit" ] && cublas_dir=$(dirname "$hit")
fi
export LD_LIBRARY_PATH="${cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "env: libcublas.so.13 from ${cublas_dir:-nowhere}"
