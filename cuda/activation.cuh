// activation.cuh — the MLP's bias add fused with its nonlinearity (and, for a gated MLP,
// with the product of the activated gate and the up-projection).
#pragma once
#include "common.cuh"

namespace gollm {

__device__ __forceinline__ float activate(float x, int act) {
  switch (act) {
    case GOLLM_ACT_GELU_ERF:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case GOLLM_ACT_RELU:
      return x > 0.f ? x : 0.f;
    case GOLLM_ACT_SILU:
      return x / (1.f + expf(-x));
    default: {  // tanh approximation (gelu_new)
      const float c = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
  }
}

// bias_act_kernel: y[r][c] = act(x[r][c] + bias[c]) for x [n][width] fp32, bias [width]
// fp32 or null, y [n][width] T. Grid (n, ceil(width / W / 256)), 256 threads; a thread takes W
// consecutive elements (W = 4: 16-byte loads and 8-byte stores, for width % 4 == 0).
template <typename T, int W>
__global__ void bias_act_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                T* __restrict__ y, int width, int act) {
  static_assert(W == 1 || W == 4, "W is 1 or 4");
  griddep_launch();
  const int c = W * (blockIdx.y * blockDim.x + threadIdx.x);
  if (c >= width) return;
  const int64_t off = (int64_t)blockIdx.x * width + c;
  if constexpr (W == 4) {
    const float4 b = bias ? *reinterpret_cast<const float4*>(bias + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    griddep_wait();
    const float4 v = *reinterpret_cast<const float4*>(x + off);
    store4(y + off, activate(v.x + b.x, act), activate(v.y + b.y, act), activate(v.z + b.z, act),
           activate(v.w + b.w, act));
  } else {
    const float b = bias ? bias[c] : 0.f;
    griddep_wait();
    y[off] = from_f32<T>(activate(x[off] + b, act));
  }
}

template <typename T>
void bias_act(const float* x, const float* bias, T* y, int n, int width, int act,
              Stream stream) {
  if ((int64_t)n * width == 0) return;
  if (width % 4 == 0)
    launch("bias_act_kernel", bias_act_kernel<T, 4>, dim3(n, (width / 4 + 255) / 256), 256, 0,
           stream, x, bias, y, width, act);
  else
    launch("bias_act_kernel", bias_act_kernel<T, 1>, dim3(n, (width + 255) / 256), 256, 0, stream,
           x, bias, y, width, act);
}

// gated_act_kernel: the gated MLP's units, y[r][c] = act(x[r][c] + bg[c]) ·
// (x[r][width + c] + bu[c]) for x [n][2·width] fp32 (the gate's outputs, then the
// up-projection's), bias [2·width] fp32 or null (bg its first half, bu its second), y
// [n][width] T. Grid (n, ceil(width / 256)), 256 threads, a thread per unit.
template <typename T>
__global__ void gated_act_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                 T* __restrict__ y, int width, int act) {
  griddep_launch();
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= width) return;
  const float bg = bias ? bias[c] : 0.f, bu = bias ? bias[width + c] : 0.f;
  griddep_wait();
  const float* xr = x + (int64_t)blockIdx.x * 2 * width;
  y[(int64_t)blockIdx.x * width + c] = from_f32<T>(activate(xr[c] + bg, act) * (xr[width + c] + bu));
}

template <typename T>
void gated_act(const float* x, const float* bias, T* y, int n, int width, int act, Stream stream) {
  if ((int64_t)n * width == 0) return;
  launch("gated_act_kernel", gated_act_kernel<T>, dim3(n, (width + 255) / 256), 256, 0, stream, x,
         bias, y, width, act);
}

}  // namespace gollm
