// Rotary embedding in place on CUDA (upstream: csrc/pos_encoding_kernels.cu).
// query [T, H * D] or [T, H, D] (rows may be strided views of a fused qkv
// tensor), key likewise with Hkv heads (optional); positions [T] (or [B, S]
// with query [B, S, ...]) int64. cos_sin_cache [max_position, rot_dim]: cos
// in the first rot_dim / 2 columns, sin in the rest, of the query dtype.
// neox rotates halves (x[i], x[i + rot/2]); GPT-J interleaved pairs
// (x[2i], x[2i + 1]). One block per token; math in fp32.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "cuda_utils.cuh"
#include "dispatch_utils.h"
#include "ops.h"

namespace vllm {

struct RopeTensor {
  void* data;
  int64_t token_stride;
  int64_t head_stride;
  int num_heads;  // 0: absent
};

template <typename T>
__device__ __forceinline__ void rotate_heads(const RopeTensor& x, int64_t token, const T* cos,
                                             const T* sin, int half, bool is_neox) {
  T* base = static_cast<T*>(x.data) + token * x.token_stride;
  const int n = x.num_heads * half;
  for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    T* h = base + head * x.head_stride;
    const int i1 = is_neox ? i : 2 * i;
    const int i2 = is_neox ? i + half : 2 * i + 1;
    const float x1 = to_float(h[i1]), x2 = to_float(h[i2]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    h[i1] = from_float<T>(x1 * c - x2 * s);
    h[i2] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void rotary_embedding_kernel(const int64_t* __restrict__ positions, RopeTensor query,
                                        RopeTensor key, const T* __restrict__ cos_sin_cache,
                                        int rot_dim, bool is_neox) {
  const int64_t token = blockIdx.x;
  const T* cos = cos_sin_cache + positions[token] * rot_dim;
  const int half = rot_dim / 2;
  rotate_heads(query, token, cos, cos + half, half, is_neox);
  if (key.num_heads > 0) rotate_heads(key, token, cos, cos + half, half, is_neox);
}

}  // namespace vllm

namespace {

// Rows of `x` as [num_tokens, heads, head_size]: the token stride is the
// stride of the positions' last dim; with [.., H, D] the head stride is
// stride(-2), else heads are packed (head_size apart).
vllm::RopeTensor rope_view(const at::Tensor& x, const at::Tensor& positions, int64_t head_size,
                           const char* name) {
  const int64_t tokens = positions.numel();
  const int pos_dim = static_cast<int>(positions.dim());
  TORCH_CHECK(x.is_cuda() && x.device() == positions.device(), name,
              " must be on the device of positions");
  TORCH_CHECK(x.dim() == pos_dim + 1 || x.dim() == pos_dim + 2, name,
              " must be [num_tokens, heads * head_size] or [num_tokens, heads, head_size]");
  for (int i = 0; i < pos_dim; ++i)
    TORCH_CHECK(x.size(i) == positions.size(i), name, " and positions disagree on dim ", i);
  TORCH_CHECK(x.stride(-1) == 1, name, " must have a contiguous last dim");
  if (pos_dim == 2)
    TORCH_CHECK(x.stride(0) == x.size(1) * x.stride(1), name,
                " must have contiguous batch rows with 2-D positions");
  const int64_t hidden = tokens == 0 ? 0 : x.numel() / tokens;
  TORCH_CHECK(hidden % head_size == 0, name, " hidden size is not a multiple of head_size");
  const int64_t head_stride = x.dim() == pos_dim + 2 ? x.stride(-2) : head_size;
  return vllm::RopeTensor{x.data_ptr(), x.stride(pos_dim - 1), head_stride,
                          static_cast<int>(hidden / head_size)};
}

}  // namespace

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  TORCH_CHECK(positions.dim() == 1 || positions.dim() == 2, "positions must be [T] or [B, S]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "positions must be contiguous int64");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous() &&
                  cos_sin_cache.scalar_type() == query.scalar_type() &&
                  cos_sin_cache.device() == query.device(),
              "cos_sin_cache must be contiguous [max_position, rot_dim] of the query dtype");
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim % 2 == 0 && rot_dim <= head_size, "bad rotary dim ", rot_dim);
  const vllm::RopeTensor q = rope_view(query, positions, head_size, "query");
  vllm::RopeTensor k{nullptr, 0, 0, 0};
  if (key.has_value()) {
    TORCH_CHECK(key->scalar_type() == query.scalar_type(), "key and query must share a dtype");
    k = rope_view(*key, positions, head_size, "key");
  }
  const int64_t tokens = positions.numel();
  if (tokens == 0 || rot_dim == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(query.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t pairs = static_cast<int64_t>(std::max(q.num_heads, k.num_heads)) * rot_dim / 2;
  const int threads = vllm::row_threads(pairs, 512);
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "rotary_embedding", [&] {
    using T = vllm::cuda_t<scalar_t>;
    vllm::rotary_embedding_kernel<T><<<tokens, threads, 0, stream>>>(
        positions.data_ptr<int64_t>(), q, k, static_cast<const T*>(cos_sin_cache.data_ptr()),
        static_cast<int>(rot_dim), is_neox);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
