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

template <typename T>
void bias_act(const float* x, const float* bias, T* y, int n, int width, int act,
              Stream stream) {
  int64_t total = (int64_t)n * width;
  if (total == 0) return;
  int blocks = (int)std::min<int64_t>((total + 255) / 256, 4096);
  launch("bias_act_kernel", bias_act_kernel<T>, blocks, 256, 0, stream, x, bias, y, total, width,
         act);
}

}  // namespace gollm
