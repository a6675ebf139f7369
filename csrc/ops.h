// Declarations of the CUDA ops registered by csrc/torch_bindings.cpp
// (upstream: csrc/ops.h and csrc/cache.h). Schemas are upstream's, except
// paged_attention_decode, this project's flash-layout decode op (the same
// schema as torch.ops._C_cpu.paged_attention_decode).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon);
void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon);

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox);

void silu_and_mul(at::Tensor& out, const at::Tensor& input);

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                       const at::Tensor& v_scale);
void reshape_and_cache_flash(const at::Tensor& key, const at::Tensor& value,
                             at::Tensor& key_cache, at::Tensor& value_cache,
                             const at::Tensor& slot_mapping, const std::string& kv_cache_dtype,
                             const at::Tensor& k_scale, const at::Tensor& v_scale);

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        int64_t block_size, int64_t max_seq_len,
                        const std::optional<at::Tensor>& alibi_slopes,
                        const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                        const at::Tensor& v_scale, int64_t tp_rank,
                        int64_t blocksparse_local_blocks, int64_t blocksparse_vert_stride,
                        int64_t blocksparse_block_size, int64_t blocksparse_head_sliding_step);
void paged_attention_decode(at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& key_cache, const at::Tensor& value_cache,
                            const at::Tensor& block_table, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, double soft_cap);
