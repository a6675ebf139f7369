// KV-cache writes on CUDA (upstream: csrc/cache_kernels.cu), registered as
// torch.ops._C_cache_ops.<op> as upstream does. key/value [T, Hkv, D] (token
// rows may be strided, a token's heads contiguous); slot_mapping [>= T]
// int64 or int32, slot = block * block_size + offset, slot < 0 = padding,
// not written. Only kv_cache_dtype "auto" (cache dtype = key dtype) is built;
// k_scale / v_scale are used by fp8 caches only, so they are not read.
//
// reshape_and_cache_flash: caches [num_blocks, block_size, Hkv, D], any
//   strides on the first three dims (views of a (2, ...) KV tensor), D
//   contiguous: the layout of the TRITON_ATTN / CPU_ATTN backends.
// reshape_and_cache: upstream's paged-attention layout, contiguous:
//   key_cache [num_blocks, Hkv, D / x, block_size, x] with x = 16 / elem
//   size (16 B of a key row stored together), value_cache [num_blocks, Hkv,
//   D, block_size]. Read by paged_attention_v1.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <string>

#include "dispatch_utils.h"
#include "ops.h"

namespace vllm {

struct TokenRows {
  int64_t token_stride, head_stride;  // of key / value, in elements
};

template <typename T, typename slot_t>
__global__ void reshape_and_cache_flash_kernel(
    const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
    T* __restrict__ value_cache, const slot_t* __restrict__ slot_mapping, TokenRows k_rows,
    TokenRows v_rows, int64_t block_stride, int64_t page_stride, int64_t cache_head_stride,
    int block_size, int num_heads, int head_size) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  const int64_t dst_base = (slot / block_size) * block_stride + (slot % block_size) * page_stride;
  const int n = num_heads * head_size;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int head = i / head_size, d = i % head_size;
    const int64_t dst = dst_base + head * cache_head_stride + d;
    key_cache[dst] = key[token * k_rows.token_stride + head * k_rows.head_stride + d];
    value_cache[dst] = value[token * v_rows.token_stride + head * v_rows.head_stride + d];
  }
}

template <typename T, typename slot_t>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         T* __restrict__ key_cache, T* __restrict__ value_cache,
                                         const slot_t* __restrict__ slot_mapping,
                                         TokenRows k_rows, TokenRows v_rows, int block_size,
                                         int num_heads, int head_size, int x) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int n = num_heads * head_size;
  // Both caches hold num_heads * head_size * block_size elements per block.
  const int64_t block_base = block * n * block_size;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int head = i / head_size, d = i % head_size;
    const int64_t head_base = block_base + static_cast<int64_t>(head) * head_size * block_size;
    key_cache[head_base + (d / x) * block_size * x + offset * x + d % x] =
        key[token * k_rows.token_stride + head * k_rows.head_stride + d];
    value_cache[head_base + static_cast<int64_t>(d) * block_size + offset] =
        value[token * v_rows.token_stride + head * v_rows.head_stride + d];
  }
}

}  // namespace vllm

namespace {

struct CacheArgs {
  int64_t tokens, num_heads, head_size;
  vllm::TokenRows k_rows, v_rows;
};

CacheArgs check_cache_args(const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& slot_mapping, const std::string& kv_cache_dtype) {
  TORCH_CHECK(kv_cache_dtype == "auto", "kv_cache_dtype '", kv_cache_dtype,
              "' is not built (only 'auto': the cache keeps the model dtype)");
  TORCH_CHECK(key.is_cuda() && value.device() == key.device() &&
                  key_cache.device() == key.device() && value_cache.device() == key.device() &&
                  slot_mapping.device() == key.device(),
              "key, value, caches and slot_mapping must be on one CUDA device");
  TORCH_CHECK(key.dim() == 3 && value.sizes() == key.sizes(), "key/value must be [T, Hkv, D]");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "key/value last dim must be contiguous");
  TORCH_CHECK(value.scalar_type() == key.scalar_type() &&
                  key_cache.scalar_type() == key.scalar_type() &&
                  value_cache.scalar_type() == key.scalar_type(),
              "key, value and the caches must share a dtype");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.is_contiguous() &&
                  (slot_mapping.scalar_type() == at::kLong ||
                   slot_mapping.scalar_type() == at::kInt),
              "slot_mapping must be a contiguous 1-D int64/int32 tensor");
  const int64_t tokens = slot_mapping.size(0);
  TORCH_CHECK(key.size(0) >= tokens, "fewer key rows than slots");
  return CacheArgs{tokens, key.size(1), key.size(2), {key.stride(0), key.stride(1)},
                   {value.stride(0), value.stride(1)}};
}

#define VLLM_DISPATCH_SLOT_TYPE(SLOTS, ...)                   \
  if ((SLOTS).scalar_type() == at::kLong) {                   \
    using slot_t = int64_t;                                   \
    __VA_ARGS__();                                            \
  } else {                                                    \
    using slot_t = int32_t;                                   \
    __VA_ARGS__();                                            \
  }

}  // namespace

void reshape_and_cache_flash(const at::Tensor& key, const at::Tensor& value,
                             at::Tensor& key_cache, at::Tensor& value_cache,
                             const at::Tensor& slot_mapping, const std::string& kv_cache_dtype,
                             const at::Tensor& /*k_scale*/, const at::Tensor& /*v_scale*/) {
  const CacheArgs a =
      check_cache_args(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype);
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.size(2) == a.num_heads &&
                  key_cache.size(3) == a.head_size && key_cache.stride(3) == 1,
              "key_cache must be [num_blocks, block_size, Hkv, D] with D contiguous");
  TORCH_CHECK(value_cache.sizes() == key_cache.sizes() &&
                  value_cache.strides() == key_cache.strides(),
              "key_cache and value_cache must have the same shape and strides");
  if (a.tokens == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(key.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads = static_cast<int>(std::min<int64_t>(a.num_heads * a.head_size, 512));
  VLLM_DISPATCH_FLOATING_TYPES(key.scalar_type(), "reshape_and_cache_flash", [&] {
    using T = vllm::cuda_t<scalar_t>;
    VLLM_DISPATCH_SLOT_TYPE(slot_mapping, [&] {
      vllm::reshape_and_cache_flash_kernel<T, slot_t><<<a.tokens, threads, 0, stream>>>(
          static_cast<const T*>(key.data_ptr()), static_cast<const T*>(value.data_ptr()),
          static_cast<T*>(key_cache.data_ptr()), static_cast<T*>(value_cache.data_ptr()),
          static_cast<const slot_t*>(slot_mapping.data_ptr()), a.k_rows, a.v_rows,
          key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
          static_cast<int>(key_cache.size(1)), static_cast<int>(a.num_heads),
          static_cast<int>(a.head_size));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const at::Tensor& /*k_scale*/,
                       const at::Tensor& /*v_scale*/) {
  const CacheArgs a =
      check_cache_args(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype);
  const int64_t x = 16 / key.element_size();
  TORCH_CHECK(key_cache.dim() == 5 && key_cache.is_contiguous() &&
                  key_cache.size(1) == a.num_heads && key_cache.size(2) * x == a.head_size &&
                  key_cache.size(4) == x,
              "key_cache must be contiguous [num_blocks, Hkv, D / x, block_size, x], x = ", x);
  const int64_t block_size = key_cache.size(3);
  TORCH_CHECK(value_cache.dim() == 4 && value_cache.is_contiguous() &&
                  value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == a.num_heads &&
                  value_cache.size(2) == a.head_size && value_cache.size(3) == block_size,
              "value_cache must be contiguous [num_blocks, Hkv, D, block_size]");
  if (a.tokens == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(key.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int threads = static_cast<int>(std::min<int64_t>(a.num_heads * a.head_size, 512));
  VLLM_DISPATCH_FLOATING_TYPES(key.scalar_type(), "reshape_and_cache", [&] {
    using T = vllm::cuda_t<scalar_t>;
    VLLM_DISPATCH_SLOT_TYPE(slot_mapping, [&] {
      vllm::reshape_and_cache_kernel<T, slot_t><<<a.tokens, threads, 0, stream>>>(
          static_cast<const T*>(key.data_ptr()), static_cast<const T*>(value.data_ptr()),
          static_cast<T*>(key_cache.data_ptr()), static_cast<T*>(value_cache.data_ptr()),
          static_cast<const slot_t*>(slot_mapping.data_ptr()), a.k_rows, a.v_rows,
          static_cast<int>(block_size), static_cast<int>(a.num_heads),
          static_cast<int>(a.head_size), static_cast<int>(x));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
