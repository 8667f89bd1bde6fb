// activation.cuh — the MLP's bias add fused with its nonlinearity.
#pragma once
#include "common.cuh"

namespace gollm {

__device__ __forceinline__ float activate(float x, int act) {
  switch (act) {
    case GOLLM_ACT_GELU_ERF:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case GOLLM_ACT_RELU:
      return x > 0.f ? x : 0.f;
    default: {  // tanh approximation (gelu_new)
      const float c = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
  }
}

// bias_act_kernel: y[r][c] = act(x[r][c] + bias[c]) for x [n][width] fp32, bias [width] fp32,
// y [n][width] T. Grid-stride over the n*width elements.
template <typename T>
__global__ void bias_act_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                T* __restrict__ y, int64_t total, int width, int act) {
  griddep_launch();
  griddep_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    y[i] = from_f32<T>(activate(x[i] + bias[i % width], act));
  }
}

// bias_act4_kernel: the same for width % 4 == 0, four elements a thread (16-byte loads,
// 8-byte stores) and no 64-bit modulo. Grid (ceil(width / 4 / 256), n), 256 threads.
template <typename T>
__global__ void bias_act4_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                 T* __restrict__ y, int width, int act) {
  griddep_launch();
  const int c4 = blockIdx.x * blockDim.x + threadIdx.x;
  if (c4 * 4 >= width) return;
  const float4 b = reinterpret_cast<const float4*>(bias)[c4];
  griddep_wait();
  const int64_t off = (int64_t)blockIdx.y * width + 4 * c4;
  const float4 v = *reinterpret_cast<const float4*>(x + off);
  alignas(8) T out[4] = {from_f32<T>(activate(v.x + b.x, act)), from_f32<T>(activate(v.y + b.y, act)),
                         from_f32<T>(activate(v.z + b.z, act)), from_f32<T>(activate(v.w + b.w, act))};
  *reinterpret_cast<uint2*>(y + off) = *reinterpret_cast<const uint2*>(out);
}

template <typename T>
void bias_act(const float* x, const float* bias, T* y, int n, int width, int act,
              Stream stream) {
  int64_t total = (int64_t)n * width;
  if (total == 0) return;
  if (width % 4 == 0 && n <= 65535) {
    launch("bias_act4_kernel", bias_act4_kernel<T>, dim3((width / 4 + 255) / 256, n), 256, 0,
           stream, x, bias, y, width, act);
    return;
  }
  int blocks = (int)std::min<int64_t>((total + 255) / 256, 4096);
  launch("bias_act_kernel", bias_act_kernel<T>, blocks, 256, 0, stream, x, bias, y, total, width,
         act);
}

}  // namespace gollm
