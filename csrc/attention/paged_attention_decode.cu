// torch.ops._C.paged_attention_decode: decode attention over the flash
// layout the TRITON_ATTN / CPU_ATTN backends use, key/value caches
// [num_blocks, block_size, num_kv_heads, head_size] (views of one
// (2, ...) tensor allowed). The schema is torch.ops._C_cpu's (this project's
// op): sliding_window <= 0 and soft_cap <= 0 mean none.
#include "../dispatch_utils.h"
#include "../ops.h"
#include "attention_utils.h"

void paged_attention_decode(at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& key_cache, const at::Tensor& value_cache,
                            const at::Tensor& block_table, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, double soft_cap) {
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() &&
                  value_cache.strides() == key_cache.strides(),
              "key/value caches must be [num_blocks, block_size, num_kv_heads, head_size] "
              "with equal strides");
  TORCH_CHECK(key_cache.device() == query.device() && value_cache.device() == query.device(),
              "caches must be on the query's device");
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() &&
                  value_cache.scalar_type() == query.scalar_type(),
              "caches must have the query dtype");
  TORCH_CHECK(key_cache.size(3) == query.size(2), "cache head_size differs from the query's");
  TORCH_CHECK(key_cache.stride(3) == 1 && key_cache.stride(0) % 8 == 0 &&
                  key_cache.stride(1) % 8 == 0 && key_cache.stride(2) % 8 == 0 &&
                  vllm::aligned16(key_cache) && vllm::aligned16(value_cache),
              "cache rows must be contiguous and 16-byte aligned");
  vllm::DecodeParams p = vllm::decode_params(out, query, block_table, seq_lens,
                                             key_cache.size(2), key_cache.size(1), scale);
  p.sliding_window = sliding_window > 0 ? static_cast<int>(sliding_window) : 0;
  p.soft_cap = soft_cap > 0 ? static_cast<float>(soft_cap) : 0.f;
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "paged_attention_decode", [&] {
    using T = vllm::cuda_t<scalar_t>;
    const vllm::FlashCache<T> cache{static_cast<const T*>(key_cache.data_ptr()),
                                    static_cast<const T*>(value_cache.data_ptr()),
                                    key_cache.stride(0), key_cache.stride(1), key_cache.stride(2)};
    vllm::launch_paged_decode<T>(query, p, cache);
  });
}
