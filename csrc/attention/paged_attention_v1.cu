// torch.ops._C.paged_attention_v1 with upstream's schema, over upstream's
// paged-attention cache layout (what torch.ops._C_cache_ops.reshape_and_cache
// writes): key_cache [num_blocks, Hkv, D / x, block_size, x], x = 16 / elem
// size, value_cache [num_blocks, Hkv, D, block_size], both contiguous.
// Built: kv_cache_dtype "auto", optional ALiBi slopes (fp32 [num_heads]).
// Not built (clear errors): fp8 caches and block-sparse attention.
// max_seq_len and tp_rank are not needed by this kernel.
#include "../dispatch_utils.h"
#include "../ops.h"
#include "attention_utils.h"

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        int64_t block_size, int64_t /*max_seq_len*/,
                        const std::optional<at::Tensor>& alibi_slopes,
                        const std::string& kv_cache_dtype, const at::Tensor& /*k_scale*/,
                        const at::Tensor& /*v_scale*/, int64_t /*tp_rank*/,
                        int64_t /*blocksparse_local_blocks*/, int64_t blocksparse_vert_stride,
                        int64_t /*blocksparse_block_size*/,
                        int64_t /*blocksparse_head_sliding_step*/) {
  TORCH_CHECK(kv_cache_dtype == "auto", "kv_cache_dtype '", kv_cache_dtype, "' is not built");
  TORCH_CHECK(blocksparse_vert_stride <= 1, "block-sparse paged attention is not built");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt, "block_tables must be int32");
  const int64_t head_size = query.size(-1), x = 16 / query.element_size();
  TORCH_CHECK(key_cache.dim() == 5 && key_cache.is_contiguous() &&
                  key_cache.size(1) == num_kv_heads && key_cache.size(2) * x == head_size &&
                  key_cache.size(3) == block_size && key_cache.size(4) == x,
              "key_cache must be contiguous [num_blocks, num_kv_heads, head_size / x, "
              "block_size, x] with x = ", x);
  TORCH_CHECK(value_cache.dim() == 4 && value_cache.is_contiguous() &&
                  value_cache.size(0) == key_cache.size(0) &&
                  value_cache.size(1) == num_kv_heads && value_cache.size(2) == head_size &&
                  value_cache.size(3) == block_size,
              "value_cache must be contiguous [num_blocks, num_kv_heads, head_size, block_size]");
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() &&
                  value_cache.scalar_type() == query.scalar_type() &&
                  key_cache.device() == query.device() && value_cache.device() == query.device(),
              "caches must have the query's dtype and device");
  vllm::DecodeParams p = vllm::decode_params(out, query, block_tables, seq_lens, num_kv_heads,
                                             block_size, scale);
  if (alibi_slopes.has_value()) {
    TORCH_CHECK(alibi_slopes->scalar_type() == at::kFloat && alibi_slopes->is_contiguous() &&
                    alibi_slopes->numel() == query.size(1) &&
                    alibi_slopes->device() == query.device(),
                "alibi_slopes must be contiguous fp32 [num_heads] on the query's device");
    p.alibi_slopes = alibi_slopes->data_ptr<float>();
  }
  VLLM_DISPATCH_FLOATING_TYPES(query.scalar_type(), "paged_attention_v1", [&] {
    using T = vllm::cuda_t<scalar_t>;
    const vllm::SplitCache<T> cache{static_cast<const T*>(key_cache.data_ptr()),
                                    static_cast<const T*>(value_cache.data_ptr()),
                                    static_cast<int>(num_kv_heads), static_cast<int>(head_size),
                                    static_cast<int>(block_size)};
    vllm::launch_paged_decode<T>(query, p, cache);
  });
}
