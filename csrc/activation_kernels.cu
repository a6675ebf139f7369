// silu_and_mul on CUDA (upstream: csrc/activation_kernels.cu):
// out[t, i] = silu(x[t, i]) * x[t, d + i] for x [..., 2d], in fp32, rounded
// once. One block per token.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_utils.cuh"
#include "dispatch_utils.h"
#include "ops.h"

namespace vllm {

template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, int64_t out_stride,
                                    const T* __restrict__ input, int64_t in_stride, int d) {
  const T* x = input + static_cast<int64_t>(blockIdx.x) * in_stride;
  T* y = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float a = to_float(x[i]);
    y[i] = from_float<T>(a / (1.f + expf(-a)) * to_float(x[d + i]));
  }
}

}  // namespace vllm

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  TORCH_CHECK(input.is_cuda() && out.device() == input.device(),
              "input and out must be on the same CUDA device");
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), "out and input must share a dtype");
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(input.size(-1) == 2 * d && out.size(-1) == d && out.numel() * 2 == input.numel(),
              "input must be [..., 2 * d] and out [..., d]");
  // Rows: a 2-D tensor may have padded rows; more dims must be contiguous.
  TORCH_CHECK(input.stride(-1) == 1 && out.stride(-1) == 1, "last dims must be contiguous");
  TORCH_CHECK((input.dim() == 2 || input.is_contiguous()) && (out.dim() == 2 || out.is_contiguous()),
              "tensors with more than 2 dims must be contiguous");
  const int64_t in_stride = input.dim() == 2 ? input.stride(0) : 2 * d;
  const int64_t out_stride = out.dim() == 2 ? out.stride(0) : d;
  const int64_t rows = d == 0 ? 0 : input.numel() / (2 * d);
  if (rows == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads = vllm::row_threads(d, 1024);
  VLLM_DISPATCH_FLOATING_TYPES(input.scalar_type(), "silu_and_mul", [&] {
    using T = vllm::cuda_t<scalar_t>;
    vllm::silu_and_mul_kernel<T><<<rows, threads, 0, stream>>>(
        static_cast<T*>(out.data_ptr()), out_stride, static_cast<const T*>(input.data_ptr()),
        in_stride, static_cast<int>(d));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
