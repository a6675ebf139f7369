// RMSNorm on CUDA (upstream: csrc/layernorm_kernels.cu): one block per row of
// [num_tokens, hidden]; the sum of squares is reduced in fp32 across the
// block, the output rounded once to the input dtype.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_utils.cuh"
#include "dispatch_utils.h"
#include "ops.h"

namespace vllm {

template <typename T>
__global__ void rms_norm_kernel(T* __restrict__ out, int64_t out_stride,
                                const T* __restrict__ input, int64_t in_stride,
                                const T* __restrict__ weight, float epsilon, int hidden) {
  const T* x = input + static_cast<int64_t>(blockIdx.x) * in_stride;
  T* y = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(x[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / hidden + epsilon);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    y[i] = from_float<T>(to_float(x[i]) * inv_rms * to_float(weight[i]));
}

// residual <- input + residual (rounded to T, as the reference adds in T);
// input <- rms_norm(residual) * weight.
template <typename T>
__global__ void fused_add_rms_norm_kernel(T* __restrict__ input, int64_t in_stride,
                                          T* __restrict__ residual, int64_t res_stride,
                                          const T* __restrict__ weight, float epsilon,
                                          int hidden) {
  T* x = input + static_cast<int64_t>(blockIdx.x) * in_stride;
  T* r = residual + static_cast<int64_t>(blockIdx.x) * res_stride;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const T sum = from_float<T>(to_float(x[i]) + to_float(r[i]));
    r[i] = sum;
    const float v = to_float(sum);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / hidden + epsilon);
  // Each thread reads back only the elements it wrote itself.
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    x[i] = from_float<T>(to_float(r[i]) * inv_rms * to_float(weight[i]));
}

}  // namespace vllm

namespace {

// [..., hidden] with a contiguous last dim, seen as rows: returns the row
// stride (a 2-D tensor may have padded rows; more dims must be contiguous).
int64_t row_stride(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() >= 1 && t.stride(-1) == 1, name, " must have a contiguous last dim");
  if (t.dim() == 2) return t.stride(0);
  TORCH_CHECK(t.is_contiguous(), name, " with more than 2 dims must be contiguous");
  return t.size(-1);
}

void check_norm_args(const at::Tensor& input, const at::Tensor& other,
                     const at::Tensor& weight) {
  TORCH_CHECK(other.sizes() == input.sizes(), "shape mismatch: ", other.sizes(), " vs ",
              input.sizes());
  TORCH_CHECK(weight.is_cuda() && weight.dim() == 1 && weight.is_contiguous() &&
                  weight.size(0) == input.size(-1),
              "weight must be a contiguous CUDA tensor of shape [hidden]");
  TORCH_CHECK(other.scalar_type() == input.scalar_type() &&
                  weight.scalar_type() == input.scalar_type(),
              "input, output/residual and weight must share a dtype");
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  check_norm_args(input, out, weight);
  const int64_t in_stride = row_stride(input, "input"), out_stride = row_stride(out, "out");
  const int64_t hidden = input.size(-1);
  const int64_t rows = hidden == 0 ? 0 : input.numel() / hidden;
  if (rows == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads = vllm::row_threads(hidden, 1024);
  VLLM_DISPATCH_FLOATING_TYPES(input.scalar_type(), "rms_norm", [&] {
    using T = vllm::cuda_t<scalar_t>;
    vllm::rms_norm_kernel<T><<<rows, threads, 0, stream>>>(
        static_cast<T*>(out.data_ptr()), out_stride, static_cast<const T*>(input.data_ptr()),
        in_stride, static_cast<const T*>(weight.data_ptr()), static_cast<float>(epsilon),
        static_cast<int>(hidden));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  check_norm_args(input, residual, weight);
  const int64_t in_stride = row_stride(input, "input");
  const int64_t res_stride = row_stride(residual, "residual");
  const int64_t hidden = input.size(-1);
  const int64_t rows = hidden == 0 ? 0 : input.numel() / hidden;
  if (rows == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads = vllm::row_threads(hidden, 1024);
  VLLM_DISPATCH_FLOATING_TYPES(input.scalar_type(), "fused_add_rms_norm", [&] {
    using T = vllm::cuda_t<scalar_t>;
    vllm::fused_add_rms_norm_kernel<T><<<rows, threads, 0, stream>>>(
        static_cast<T*>(input.data_ptr()), in_stride, static_cast<T*>(residual.data_ptr()),
        res_stride, static_cast<const T*>(weight.data_ptr()), static_cast<float>(epsilon),
        static_cast<int>(hidden));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
