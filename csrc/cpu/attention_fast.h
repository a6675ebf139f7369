// Fast path of the paged decode attention (see attention.cpp for the layout
// and the work split), for head sizes 64 / 128 and block sizes that are
// multiples of the vector width (AVX-512: 16, AVX2: 8). Per block of K/V
// rows, one vector width of tokens at a time (described for AVX-512; the
// AVX2 version below is the same with 8 lanes, FMAs for bf16 too):
//   scores: for each query head g, 16 per-token dot products are kept as 16
//     vector partial sums (bf16: `vdpbf16ps` on raw bf16 pairs, no
//     conversion; fp32: FMAs), then reduced together into one vector of 16
//     scores by a transpose-add tree (~3 ops per token instead of a
//     horizontal reduction per (token, head));
//   softmax: online, fp32, 16 lanes at a time;
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
}  // namespace vllm_cpu
#endif

#ifdef VLLM_CPU_AVX512
namespace vllm_cpu {

// Lane i of the result = sum of the 16 lanes of v[i].
inline __m512 reduce16x16(const __m512* v) {
  __m512 u[4];
  for (int q = 0; q < 4; ++q) {
    const __m512* w = v + 4 * q;
    __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
    // Per 128-bit lane: [sum w0, sum w1, sum w2, sum w3] over that lane.
    u[q] = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
  }
  // Sum the four 128-bit lanes of each u[q] into 128-bit lane q of the result.
  __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

// Query of one head, kept in the form the dot products want.
template <typename T, int D>
struct QueryRow {  // fp32 and fp16 (widened per load by vcvtph2ps)
  __m512 v[D / 16];
  void load(const T* q) { for (int c = 0; c < D / 16; ++c) v[c] = load16(q + c * 16); }
  // 16 lanes whose sum is q . k
  __m512 dot(const T* k) const {
    __m512 acc = _mm512_mul_ps(v[0], load16(k));
    for (int c = 1; c < D / 16; ++c) acc = _mm512_fmadd_ps(v[c], load16(k + c * 16), acc);
    return acc;
  }
};

template <int D>
struct QueryRow<bf16, D> {
#ifdef __AVX512BF16__
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
#else
  __m512 v[D / 16];
  void load(const bf16* q) { for (int c = 0; c < D / 16; ++c) v[c] = load16(q + c * 16); }
  __m512 dot(const bf16* k) const {
    __m512 acc = _mm512_mul_ps(v[0], load16(k));
    for (int c = 1; c < D / 16; ++c) acc = _mm512_fmadd_ps(v[c], load16(k + c * 16), acc);
    return acc;
  }
#endif
};

// One block of K/V for the G heads of a kv head. `lo..hi` are the valid
// token offsets in the block. m/l/acc: running max, sum, [G, D] accumulator.
template <typename T, int D>
void fast_block(const FastParams& p, const QueryRow<T, D>* q, const T* kb, const T* vb,
                int64_t lo, int64_t hi, float* m, float* l, float* acc, float* scores,
                float* vf) {
  const int64_t bs = p.block_size;
  // Scores [G, bs] (invalid lanes = -inf).
  for (int64_t t0 = 0; t0 < bs; t0 += 16) {
    if (t0 >= hi || t0 + 16 <= lo) {
      for (int64_t g = 0; g < p.g_count; ++g)
        _mm512_storeu_ps(scores + g * bs + t0, _mm512_set1_ps(-INFINITY));
      continue;
    }
    __mmask16 valid = 0;
    for (int i = 0; i < 16; ++i) valid |= static_cast<__mmask16>((t0 + i >= lo && t0 + i < hi) << i);
    for (int64_t g = 0; g < p.g_count; ++g) {
      __m512 part[16];
      for (int i = 0; i < 16; ++i)
        part[i] = (valid >> i) & 1 ? q[g].dot(kb + (t0 + i) * p.k_stride_tok) : _mm512_setzero_ps();
      __m512 s = _mm512_mul_ps(reduce16x16(part), _mm512_set1_ps(p.scale));
      if (p.soft_cap > 0) s = soft_cap_lanes(s, p.soft_cap);
      _mm512_storeu_ps(scores + g * bs + t0, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, s));
    }
  }
  // Valid V rows -> fp32 once for all heads.
  for (int64_t t = lo; t < hi; ++t)
    for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(vf + t * D + c * 16, load16(vb + t * p.v_stride_tok + c * 16));
  for (int64_t g = 0; g < p.g_count; ++g) {
    float* sg = scores + g * bs;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t t0 = 0; t0 < bs; t0 += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(sg + t0));
    const float new_max = std::max(m[g], _mm512_reduce_max_ps(vmax));
    const float rescale = std::exp(m[g] - new_max);
    __m512 vsum = _mm512_setzero_ps(), vm = _mm512_set1_ps(new_max);
    for (int64_t t0 = 0; t0 < bs; t0 += 16) {
      // exp of -inf lanes: exp16 clamps to a tiny value; those lanes are
      // zeroed so they add nothing to the sum (and are never used for V).
      __m512 x = _mm512_loadu_ps(sg + t0);
      __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      __m512 e = _mm512_maskz_mov_ps(ok, exp16(_mm512_sub_ps(x, vm)));
      _mm512_storeu_ps(sg + t0, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    l[g] = l[g] * rescale + _mm512_reduce_add_ps(vsum);
    m[g] = new_max;
    __m512 a[D / 16];
    const __m512 r = _mm512_set1_ps(rescale);
    for (int c = 0; c < D / 16; ++c) a[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + c * 16), r);
    for (int64_t t = lo; t < hi; ++t) {
      const __m512 pt = _mm512_set1_ps(sg[t]);
      for (int c = 0; c < D / 16; ++c) a[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vf + t * D + c * 16), a[c]);
    }
    for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(acc + g * D + c * 16, a[c]);
  }
}

}  // namespace vllm_cpu
#endif  // VLLM_CPU_AVX512

#ifdef VLLM_CPU_AVX2
namespace vllm_cpu {

// Lane i of the result = sum of the 8 lanes of v[i].
inline __m256 reduce8x8(const __m256* v) {
  // hadd pairs lanes within each 128-bit half: u0 holds, per half, the
  // half-sums of v[0..3], u1 those of v[4..7]; adding the halves finishes.
  __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Query of one head in fp32 lanes (bf16 keys are widened per load: AVX2
// has no bf16 dot product).
template <typename T, int D>
struct QueryRow {
  __m256 v[D / 8];
  void load(const T* q) { for (int c = 0; c < D / 8; ++c) v[c] = simd::load(q + c * 8); }
  // 8 lanes whose sum is q . k
  __m256 dot(const T* k) const {
    __m256 acc = _mm256_mul_ps(v[0], simd::load(k));
    for (int c = 1; c < D / 8; ++c) acc = _mm256_fmadd_ps(v[c], simd::load(k + c * 8), acc);
    return acc;
  }
};

// Scores [G, bs] of one block, 8 tokens at a time (invalid lanes = -inf).
template <typename T, int D>
void fast_scores(const FastParams& p, const QueryRow<T, D>* q, const T* kb, int64_t lo,
                 int64_t hi, float* scores) {
  const int64_t bs = p.block_size;
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  for (int64_t t0 = 0; t0 < bs; t0 += 8) {
    if (t0 >= hi || t0 + 8 <= lo) {
      for (int64_t g = 0; g < p.g_count; ++g) _mm256_storeu_ps(scores + g * bs + t0, ninf);
      continue;
    }
    // lane i is valid when lo <= t0 + i < hi
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(t0)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i valid = _mm256_andnot_si256(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), idx),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), idx));
    for (int64_t g = 0; g < p.g_count; ++g) {
      __m256 part[8];
      for (int i = 0; i < 8; ++i)
        part[i] = t0 + i >= lo && t0 + i < hi ? q[g].dot(kb + (t0 + i) * p.k_stride_tok)
                                              : _mm256_setzero_ps();
      __m256 s = _mm256_mul_ps(reduce8x8(part), _mm256_set1_ps(p.scale));
      if (p.soft_cap > 0) s = soft_cap_lanes(s, p.soft_cap);
      _mm256_storeu_ps(scores + g * bs + t0, _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(valid)));
    }
  }
}

// One block of K/V for the G heads of a kv head (as the AVX-512 version).
template <typename T, int D>
void fast_block(const FastParams& p, const QueryRow<T, D>* q, const T* kb, const T* vb,
                int64_t lo, int64_t hi, float* m, float* l, float* acc, float* scores,
                float* vf) {
  const int64_t bs = p.block_size;
  fast_scores<T, D>(p, q, kb, lo, hi, scores);
  for (int64_t t = lo; t < hi; ++t)
    for (int c = 0; c < D / 8; ++c) _mm256_storeu_ps(vf + t * D + c * 8, simd::load(vb + t * p.v_stride_tok + c * 8));
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  for (int64_t g = 0; g < p.g_count; ++g) {
    float* sg = scores + g * bs;
    __m256 vmax = ninf;
    for (int64_t t0 = 0; t0 < bs; t0 += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sg + t0));
    const float new_max = std::max(m[g], simd::hmax(vmax));
    const float rescale = std::exp(m[g] - new_max);
    __m256 vsum = _mm256_setzero_ps();
    const __m256 vm = _mm256_set1_ps(new_max);
    for (int64_t t0 = 0; t0 < bs; t0 += 8) {
      // -inf lanes: exp clamps them to a tiny value; zeroed so they add nothing.
      __m256 x = _mm256_loadu_ps(sg + t0);
      __m256 e = _mm256_and_ps(_mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ), simd::exp(_mm256_sub_ps(x, vm)));
      _mm256_storeu_ps(sg + t0, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    l[g] = l[g] * rescale + simd::hsum(vsum);
    m[g] = new_max;
    __m256 a[D / 8];
    const __m256 r = _mm256_set1_ps(rescale);
    for (int c = 0; c < D / 8; ++c) a[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + g * D + c * 8), r);
    for (int64_t t = lo; t < hi; ++t) {
      const __m256 pt = _mm256_set1_ps(sg[t]);
      for (int c = 0; c < D / 8; ++c) a[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vf + t * D + c * 8), a[c]);
    }
    for (int c = 0; c < D / 8; ++c) _mm256_storeu_ps(acc + g * D + c * 8, a[c]);
  }
}

}  // namespace vllm_cpu
#endif  // VLLM_CPU_AVX2
