# Sourced on the GPU machine: puts a CUDA 13 cuBLAS on the loader's path for
# libgollm_cuda.so (the one of the PyTorch wheels there, else the system toolkit's), and
# NCCL's libnccl.so.2 for tensor parallelism (the PyTorch wheels' nvidia-nccl, else a
# system install), which the library opens with dlopen only when asked.
libdirs=$(python3 - <<'PY' 2>/dev/null
import glob, os
cublas = nccl = ""
try:
    import nvidia
    for base in nvidia.__path__:
        for hit in sorted(glob.glob(os.path.join(base, "*", "lib", "libcublas.so.13"))):
            cublas = cublas or os.path.dirname(hit)
        for hit in sorted(glob.glob(os.path.join(base, "nccl*", "lib", "libnccl.so.2")) +
                          glob.glob(os.path.join(base, "*", "lib", "libnccl.so.2"))):
            nccl = nccl or os.path.dirname(hit)
except ImportError:
    pass
print(cublas + "|" + nccl)
PY
)
cublas_dir=${libdirs%%|*}
nccl_dir=${libdirs#*|}
[ "$nccl_dir" = "$libdirs" ] && nccl_dir=
if [ -z "$cublas_dir" ]; then
  hit=$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2>/dev/null | head -1)
  [ -n "$hit" ] && cublas_dir=$(dirname "$hit")
fi
if [ -z "$nccl_dir" ]; then
  hit=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 /usr/local/nccl/lib/libnccl.so.2 2>/dev/null | head -1)
  [ -n "$hit" ] && nccl_dir=$(dirname "$hit")
fi
for d in "$nccl_dir" "$cublas_dir"; do
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
echo "env: libcublas.so.13 from ${cublas_dir:-nowhere}; libnccl.so.2 from ${nccl_dir:-nowhere}"
