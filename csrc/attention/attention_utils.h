// Host-side checks and launch shared by paged_attention_v1.cu and
// paged_attention_decode.cu.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "attention_kernels.cuh"

namespace vllm {

inline bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// query / out [num_seqs, num_heads, head_size] (head dim contiguous, rows
// 16-byte aligned), block_table [num_seqs, max_blocks] int32/int64,
// seq_lens [num_seqs] int32. Fills everything but the cache-specific fields.
inline DecodeParams decode_params(at::Tensor& out, const at::Tensor& query,
                                  const at::Tensor& block_table, const at::Tensor& seq_lens,
                                  int64_t num_kv_heads, int64_t block_size, double scale) {
  TORCH_CHECK(query.is_cuda() && out.device() == query.device() &&
                  block_table.device() == query.device() && seq_lens.device() == query.device(),
              "query, out, block_table and seq_lens must be on one CUDA device");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes() &&
                  out.scalar_type() == query.scalar_type(),
              "query and out must be [num_seqs, num_heads, head_size] of one dtype");
  const int64_t num_seqs = query.size(0), num_heads = query.size(1), head_size = query.size(2);
  TORCH_CHECK(head_size % 8 == 0 && head_size <= kMaxHeadSize,
              "head_size must be a multiple of 8 up to ", kMaxHeadSize, ", got ", head_size);
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  TORCH_CHECK(query.stride(2) == 1 && query.stride(0) % 8 == 0 && query.stride(1) % 8 == 0 &&
                  aligned16(query),
              "query rows must be contiguous and 16-byte aligned");
  TORCH_CHECK(out.stride(2) == 1, "out must have a contiguous head dim");
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) >= num_seqs &&
                  block_table.stride(1) == 1 &&
                  (block_table.scalar_type() == at::kInt || block_table.scalar_type() == at::kLong),
              "block_table must be [num_seqs, max_blocks] int32/int64 with contiguous rows");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) >= num_seqs && seq_lens.is_contiguous() &&
                  seq_lens.scalar_type() == at::kInt,
              "seq_lens must be a contiguous int32 tensor of num_seqs lengths");
  DecodeParams p{};
  p.out = out.data_ptr();
  p.query = query.data_ptr();
  p.q_stride_seq = query.stride(0);
  p.q_stride_head = query.stride(1);
  p.o_stride_seq = out.stride(0);
  p.o_stride_head = out.stride(1);
  p.block_table = block_table.data_ptr();
  p.bt_int64 = block_table.scalar_type() == at::kLong;
  p.bt_stride = block_table.stride(0);
  p.seq_lens = seq_lens.data_ptr<int>();
  p.alibi_slopes = nullptr;
  p.num_heads = static_cast<int>(num_heads);
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.head_size = static_cast<int>(head_size);
  p.block_size = static_cast<int>(block_size);
  p.scale = static_cast<float>(scale);
  p.soft_cap = 0.f;
  p.sliding_window = 0;
  return p;
}

template <typename T, typename Cache>
void launch_paged_decode(const at::Tensor& query, const DecodeParams& p, const Cache& cache) {
  const int64_t num_seqs = query.size(0);
  if (num_seqs == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(query.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(p.num_heads));
  paged_decode_kernel<T, Cache><<<grid, kDecodeThreads, 0, stream>>>(p, cache);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace vllm
