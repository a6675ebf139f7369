// Fast path of the paged decode attention (see attention.cpp for the layout
// and the work split), for head sizes 64 / 128 and block sizes that are
// multiples of the vector width (kLanes: AVX-512 16, AVX2 8). Written once
// over the simd layer of cpu_types.h. Per block of K/V rows, kLanes tokens
// at a time:
//   scores: for each query head g, kLanes per-token dot products are kept as
//     kLanes vector partial sums (fp32 FMAs; bf16 on AVX512-BF16:
//     `vdpbf16ps` on raw bf16 pairs, no conversion), then reduced together
//     into one vector of kLanes scores by simd::transpose_sum (~3 ops per
//     token instead of a horizontal reduction per (token, head));
//   softmax: online, fp32, kLanes lanes at a time;
//   P @ V: the valid V rows are widened to fp32 once per block, then each
//     head's accumulator row stays in registers over the block's tokens.
#pragma once

#include "cpu_types.h"

#ifdef VLLM_CPU_SIMD
namespace vllm_cpu {

struct FastParams {
  int64_t g_count, block_size, k_stride_tok, v_stride_tok;
  float scale, soft_cap;
};

// soft_cap * tanh(s / soft_cap) on the lanes of s (std::tanh per lane: the
// capped models are rare, exactness matters more than speed here).
inline simd::fvec soft_cap_lanes(simd::fvec s, float cap) {
  alignas(64) float tmp[simd::kLanes];
  simd::store(tmp, s);
  for (int i = 0; i < simd::kLanes; ++i) tmp[i] = cap * std::tanh(tmp[i] / cap);
  return simd::load(tmp);
}

// Query of one head in fp32 lanes (bf16 / fp16 keys widened per load).
template <typename T, int D>
struct QueryRow {
  static constexpr int kChunks = D / simd::kLanes;
  simd::fvec v[kChunks];
  void load(const T* q) {
    for (int c = 0; c < kChunks; ++c) v[c] = simd::load(q + c * simd::kLanes);
  }
  // kLanes lanes whose sum is q . k
  simd::fvec dot(const T* k) const {
    simd::fvec acc = simd::mul(v[0], simd::load(k));
    for (int c = 1; c < kChunks; ++c) acc = simd::fmadd(v[c], simd::load(k + c * simd::kLanes), acc);
    return acc;
  }
};

#if defined(VLLM_CPU_AVX512) && defined(__AVX512BF16__)
// bf16 on AVX512-BF16: the query stays bf16 and vdpbf16ps multiplies 32
// raw bf16 pairs per instruction into 16 fp32 sums.
template <int D>
struct QueryRow<bf16, D> {
  __m512bh v[D / 32];
  void load(const bf16* q) {
    for (int c = 0; c < D / 32; ++c) v[c] = (__m512bh)_mm512_loadu_si512(q + c * 32);
  }
  __m512 dot(const bf16* k) const {
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < D / 32; ++c)
      acc = _mm512_dpbf16_ps(acc, v[c], (__m512bh)_mm512_loadu_si512(k + c * 32));
    return acc;
  }
};
#endif

// Scores [G, bs] of one block, kLanes tokens at a time (lanes outside the
// valid offsets lo..hi = -inf).
template <typename T, int D>
void fast_scores(const FastParams& p, const QueryRow<T, D>* q, const T* kb, int64_t lo,
                 int64_t hi, float* scores) {
  constexpr int L = simd::kLanes;
  const int64_t bs = p.block_size;
  const simd::fvec ninf = simd::set1(-INFINITY);
  for (int64_t t0 = 0; t0 < bs; t0 += L) {
    if (t0 >= hi || t0 + L <= lo) {
      for (int64_t g = 0; g < p.g_count; ++g) simd::store(scores + g * bs + t0, ninf);
      continue;
    }
    const simd::mask valid = simd::lanes_in(t0, lo, hi);
    for (int64_t g = 0; g < p.g_count; ++g) {
      simd::fvec part[L];
      for (int i = 0; i < L; ++i)
        part[i] = t0 + i >= lo && t0 + i < hi ? q[g].dot(kb + (t0 + i) * p.k_stride_tok)
                                              : simd::zero();
      simd::fvec s = simd::mul(simd::transpose_sum(part), simd::set1(p.scale));
      if (p.soft_cap > 0) s = soft_cap_lanes(s, p.soft_cap);
      simd::store(scores + g * bs + t0, simd::select(valid, s, ninf));
    }
  }
}

// One block of K/V for the G heads of a kv head. `lo..hi` are the valid
// token offsets in the block. m/l/acc: running max, sum, [G, D] accumulator;
// scores [G, bs] and vf [bs, D] are scratch.
template <typename T, int D>
void fast_block(const FastParams& p, const QueryRow<T, D>* q, const T* kb, const T* vb,
                int64_t lo, int64_t hi, float* m, float* l, float* acc, float* scores,
                float* vf) {
  constexpr int L = simd::kLanes, C = D / L;
  const int64_t bs = p.block_size;
  fast_scores<T, D>(p, q, kb, lo, hi, scores);
  // Valid V rows -> fp32 once for all heads.
  for (int64_t t = lo; t < hi; ++t)
    for (int c = 0; c < C; ++c) simd::store(vf + t * D + c * L, simd::load(vb + t * p.v_stride_tok + c * L));
  const simd::fvec ninf = simd::set1(-INFINITY);
  for (int64_t g = 0; g < p.g_count; ++g) {
    float* sg = scores + g * bs;
    simd::fvec vmax = ninf;
    for (int64_t t0 = 0; t0 < bs; t0 += L) vmax = simd::max(vmax, simd::load(sg + t0));
    const float new_max = std::max(m[g], simd::hmax(vmax));
    const float rescale = std::exp(m[g] - new_max);
    simd::fvec vsum = simd::zero();
    const simd::fvec vm = simd::set1(new_max);
    for (int64_t t0 = 0; t0 < bs; t0 += L) {
      // -inf lanes: exp clamps them to a tiny value; zeroed so they add nothing.
      const simd::fvec x = simd::load(sg + t0);
      const simd::fvec e = simd::keep(simd::neq(x, ninf), simd::exp(simd::sub(x, vm)));
      simd::store(sg + t0, e);
      vsum = simd::add(vsum, e);
    }
    l[g] = l[g] * rescale + simd::hsum(vsum);
    m[g] = new_max;
    simd::fvec a[C];
    const simd::fvec r = simd::set1(rescale);
    for (int c = 0; c < C; ++c) a[c] = simd::mul(simd::load(acc + g * D + c * L), r);
    for (int64_t t = lo; t < hi; ++t) {
      const simd::fvec pt = simd::set1(sg[t]);
      for (int c = 0; c < C; ++c) a[c] = simd::fmadd(pt, simd::load(vf + t * D + c * L), a[c]);
    }
    for (int c = 0; c < C; ++c) simd::store(acc + g * D + c * L, a[c]);
  }
}

}  // namespace vllm_cpu
#endif  // VLLM_CPU_SIMD
