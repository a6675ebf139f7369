// Paged decode attention on CUDA: one query token per sequence against its
// cached keys, read in place through the block table (upstream's
// paged_attention_v1 kernel plays this role; the algorithm here is flash-
// decoding style, its own).
//
// Grid (num_seqs, num_heads), 128 threads = 4 warps per block. A warp is 4
// groups of 8 lanes; each group takes one token at a time, so a warp covers
// 4 tokens per pass and the 4 warps interleave passes over the sequence.
// A lane owns the 8-element chunks c = lane_in_group + 8 * i (i < 4) of the
// head (head_size <= 4 * 8 * 8 = 256, a multiple of 8): it dots them with the
// query for the score (reduced over its group by shuffles) and accumulates
// p * V for the same chunks. Softmax is online in fp32: the running max is
// warp-wide, so every group rescales by the same factor; at the end the
// groups are summed by shuffles and the warps merged in shared memory.
//
// The cache layout is a policy (`Cache`): `load_k` / `load_v` return 8
// consecutive head elements of one token as floats.
#pragma once

#include <cstdint>

#include "../cuda_utils.cuh"

namespace vllm {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kLanesPerToken = 8;
constexpr int kTokensPerPass = 32 / kLanesPerToken;
constexpr int kMaxChunksPerLane = 4;
constexpr int kMaxHeadSize = kMaxChunksPerLane * kLanesPerToken * 8;

// [num_blocks, block_size, num_kv_heads, head_size]; strides in elements,
// multiples of 8 with a 16-byte aligned base (checked on the host), equal
// for K and V.
template <typename T>
struct FlashCache {
  const T* k;
  const T* v;
  int64_t block_stride, token_stride, head_stride;

  __device__ __forceinline__ int64_t row(int64_t block, int offset, int head) const {
    return block * block_stride + offset * token_stride + head * head_stride;
  }
  __device__ __forceinline__ void load_k(int64_t block, int offset, int head, int d0,
                                         float (&o)[8]) const {
    load8(k + row(block, offset, head) + d0, o);
  }
  __device__ __forceinline__ void load_v(int64_t block, int offset, int head, int d0,
                                         float (&o)[8]) const {
    load8(v + row(block, offset, head) + d0, o);
  }
};

// Upstream's layout, contiguous: key [num_blocks, Hkv, D / x, block_size, x]
// with x = 16 / sizeof(T), value [num_blocks, Hkv, D, block_size].
template <typename T>
struct SplitCache {
  const T* k;
  const T* v;
  int num_kv_heads, head_size, block_size;

  __device__ __forceinline__ int64_t head_base(int64_t block, int head) const {
    return (block * num_kv_heads + head) * static_cast<int64_t>(head_size) * block_size;
  }
  __device__ __forceinline__ void load_k(int64_t block, int offset, int head, int d0,
                                         float (&o)[8]) const {
    constexpr int x = 16 / sizeof(T);
    const T* base = k + head_base(block, head);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = d0 + j;
      o[j] = to_float(base[(d / x) * block_size * x + offset * x + d % x]);
    }
  }
  __device__ __forceinline__ void load_v(int64_t block, int offset, int head, int d0,
                                         float (&o)[8]) const {
    const T* base = v + head_base(block, head) + offset;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = to_float(base[static_cast<int64_t>(d0 + j) * block_size]);
  }
};

struct DecodeParams {
  void* out;
  const void* query;
  int64_t q_stride_seq, q_stride_head, o_stride_seq, o_stride_head;
  const void* block_table;  // int32, or int64 when bt_int64
  bool bt_int64;
  int64_t bt_stride;
  const int* seq_lens;
  const float* alibi_slopes;  // [num_heads] or nullptr
  int num_heads, num_kv_heads, head_size, block_size;
  float scale;
  float soft_cap;      // <= 0: none
  int sliding_window;  // <= 0: none (else attend to the last `sliding_window` keys)
};

__device__ __forceinline__ int64_t block_at(const DecodeParams& p, int seq, int index) {
  const int64_t row = seq * p.bt_stride + index;
  return p.bt_int64 ? static_cast<const int64_t*>(p.block_table)[row]
                    : static_cast<const int32_t*>(p.block_table)[row];
}

template <typename T, typename Cache>
__global__ void __launch_bounds__(kDecodeThreads)
    paged_decode_kernel(const DecodeParams p, const Cache cache) {
  __shared__ float s_acc[kDecodeWarps][kMaxHeadSize];
  __shared__ float s_max[kDecodeWarps], s_sum[kDecodeWarps];
  const int seq = blockIdx.x, head = blockIdx.y;
  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / kLanesPerToken, glane = lane % kLanesPerToken;
  const int chunks = p.head_size / 8;
  const int n = p.seq_lens[seq];
  const int first = (p.sliding_window > 0 && n > p.sliding_window) ? n - p.sliding_window : 0;
  const float slope = p.alibi_slopes ? p.alibi_slopes[head] : 0.f;

  // This lane's query chunks, pre-scaled, and accumulators for the same chunks.
  float q[kMaxChunksPerLane][8], acc[kMaxChunksPerLane][8];
  const T* qrow = static_cast<const T*>(p.query) + seq * p.q_stride_seq + head * p.q_stride_head;
#pragma unroll
  for (int i = 0; i < kMaxChunksPerLane; ++i) {
    const int c = glane + kLanesPerToken * i;
    if (c < chunks) load8(qrow + 8 * c, q[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[i][j] = c < chunks ? q[i][j] * p.scale : 0.f;
      acc[i][j] = 0.f;
    }
  }
  float run_max = -INFINITY, run_sum = 0.f;  // run_max is warp-uniform

  // `base` is warp-uniform, so every lane of a warp joins the shuffles.
  for (int base = first + warp * kTokensPerPass; base < n;
       base += kDecodeWarps * kTokensPerPass) {
    const int t = base + group;
    const bool valid = t < n;
    int64_t block = 0;
    const int offset = t % p.block_size;
    if (valid) block = block_at(p, seq, t / p.block_size);
    float dot = 0.f;
    if (valid) {
#pragma unroll
      for (int i = 0; i < kMaxChunksPerLane; ++i) {
        const int c = glane + kLanesPerToken * i;
        if (c >= chunks) break;
        float k[8];
        cache.load_k(block, offset, kv_head, 8 * c, k);
#pragma unroll
        for (int j = 0; j < 8; ++j) dot += q[i][j] * k[j];
      }
    }
#pragma unroll
    for (int o = kLanesPerToken / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(kFullMask, dot, o);
    float score = -INFINITY;
    if (valid) {
      score = dot;
      if (p.soft_cap > 0.f) score = p.soft_cap * tanhf(score / p.soft_cap);
      score += slope * static_cast<float>(t - n + 1);
    }
    float pass_max = score;
#pragma unroll
    for (int o = kLanesPerToken; o < 32; o <<= 1)
      pass_max = fmaxf(pass_max, __shfl_xor_sync(kFullMask, pass_max, o));
    // Group 0's token is valid (base < n), so new_max is finite.
    const float new_max = fmaxf(run_max, pass_max);
    const float alpha = expf(run_max - new_max);  // 0 on the first pass
    const float prob = valid ? expf(score - new_max) : 0.f;
    run_sum = run_sum * alpha + prob;
    run_max = new_max;
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i) {
      const int c = glane + kLanesPerToken * i;
      float v[8];
      if (valid && c < chunks) cache.load_v(block, offset, kv_head, 8 * c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        acc[i][j] = acc[i][j] * alpha + ((valid && c < chunks) ? prob * v[j] : 0.f);
    }
  }

  // Sum the 4 groups of the warp (lanes with the same glane).
#pragma unroll
  for (int o = kLanesPerToken; o < 32; o <<= 1) {
    run_sum += __shfl_xor_sync(kFullMask, run_sum, o);
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] += __shfl_xor_sync(kFullMask, acc[i][j], o);
  }
  if (group == 0) {
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i) {
      const int c = glane + kLanesPerToken * i;
      if (c < chunks)
#pragma unroll
        for (int j = 0; j < 8; ++j) s_acc[warp][8 * c + j] = acc[i][j];
    }
  }
  if (lane == 0) {
    s_max[warp] = run_max;
    s_sum[warp] = run_sum;
  }
  __syncthreads();

  // Merge the warps: weights exp(m_w - M); a warp without tokens has
  // m_w = -inf and weight 0. No keys at all (empty window): zeros.
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, s_max[w]);
  float weight[kDecodeWarps], total = 0.f;
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) {
    weight[w] = m == -INFINITY ? 0.f : expf(s_max[w] - m);
    total += weight[w] * s_sum[w];
  }
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  T* orow = static_cast<T*>(p.out) + seq * p.o_stride_seq + head * p.o_stride_head;
  for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) o += weight[w] * s_acc[w][d];
    orow[d] = from_float<T>(o * inv_total);
  }
}

}  // namespace vllm
