// Small SIMD helpers shared by the CPU ops: fp32 lanes loaded from and
// stored to fp32, bf16 or fp16 memory.
//
// ISA choice (compile time, per library): CMakeLists.txt builds these
// sources once per ISA variant (vllm._C scalar, vllm._C_avx2, _C_avx512,
// _C_avx512_bf16), each with its -m flags, and vllm/_custom_ops.py loads the
// one the running CPU supports (run-time dispatch, issue 21). This header
// picks one path from the flags of the build:
//   VLLM_CPU_AVX512  16 fp32 lanes (__m512), masked tails;
//   VLLM_CPU_AVX2    8 fp32 lanes (__m256), FMA; bf16 by 16-bit shifts,
//                    fp16 by F16C;
//   neither          scalar loops (which -O3 auto-vectorises to SSE2).
// VLLM_CPU_SIMD is set for either vector path: kernels written once over the
// `simd` layer below (fvec, kLanes, load/store/fmadd/hsum/exp, lane masks,
// transpose_sum, pair shuffles) compile to 512-bit or 256-bit code. Only
// what one ISA alone has keeps its own block (vdpbf16ps in the attention
// fast path, the bitmask stores); the raw load16 / store16 / exp16 helpers
// are AVX-512 only.
//
// Headers: the ops include ATen's per-topic headers (Tensor, Dispatch,
// Parallel), not torch/all.h, which costs twice the compile time (the ISA
// test builds every source once per ISA).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VLLM_CPU_AVX512 1
#define VLLM_CPU_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VLLM_CPU_AVX2 1
#define VLLM_CPU_SIMD 1
#endif

namespace vllm_cpu {

using bf16 = c10::BFloat16;
using fp16 = c10::Half;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return static_cast<float>(x); }
inline float to_float(fp16 x) { return static_cast<float>(x); }
template <typename T>
inline T from_float(float x) { return static_cast<T>(x); }

#ifdef VLLM_CPU_AVX512
constexpr int kVecWidth = 16;

// 16 elements -> 16 fp32 lanes.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  // bf16 is the high half of an fp32: widen to 32 bits, shift left by 16.
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const fp16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(fp16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
inline void store16(bf16* p, __m512 v) {
#ifdef __AVX512BF16__
  __m256bh packed = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i&>(packed));
#else
  // Round to nearest even by hand: add 0x7fff + lsb of the kept half.
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  // NaN keeps a quiet NaN pattern.
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc00000));
  __m256i half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), half);
#endif
}

// Masked variants for a tail of n < 16 elements.
inline __m512 load_n(const float* p, int n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
inline __m512 load_n(const bf16* p, int n) {
  __m256i raw = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
template <typename T>
inline void store_n(T* p, __m512 v, int n) {
  alignas(64) T tmp[16];
  store16(tmp, v);
  std::memcpy(p, tmp, sizeof(T) * n);
}

// exp on 16 lanes (Cephes-style range reduction + degree-6 polynomial,
// rel. error ~1e-7 on the softmax range); inputs below -87 give 0.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.3f);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT);
  // r = x - n * ln2 in two parts for accuracy.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p * 2^n
}
#endif  // VLLM_CPU_AVX512

// Which vector path this build compiled (reported by cpu_ops_isa(); the
// names of the ISA variants in CMakeLists.txt and vllm/_custom_ops.py).
#if defined(VLLM_CPU_AVX512) && defined(__AVX512BF16__)
constexpr const char* kCpuIsa = "avx512_bf16";
#elif defined(VLLM_CPU_AVX512)
constexpr const char* kCpuIsa = "avx512";
#elif defined(VLLM_CPU_AVX2)
constexpr const char* kCpuIsa = "avx2";
#else
constexpr const char* kCpuIsa = "scalar";
#endif

#ifdef VLLM_CPU_SIMD
// ------------------------------------------------------------- simd layer
// One vector of kLanes fp32 lanes and the handful of operations the kernels
// use. Loads / stores take fp32, bf16 or fp16 memory; the math is always fp32.
namespace simd {

#if defined(VLLM_CPU_AVX512)
using fvec = __m512;
constexpr int kLanes = 16;
inline fvec zero() { return _mm512_setzero_ps(); }
inline fvec set1(float a) { return _mm512_set1_ps(a); }
inline fvec add(fvec a, fvec b) { return _mm512_add_ps(a, b); }
inline fvec sub(fvec a, fvec b) { return _mm512_sub_ps(a, b); }
inline fvec mul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
inline fvec div(fvec a, fvec b) { return _mm512_div_ps(a, b); }
inline fvec max(fvec a, fvec b) { return _mm512_max_ps(a, b); }
inline fvec fmadd(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
inline fvec fmsub(fvec a, fvec b, fvec c) { return _mm512_fmsub_ps(a, b, c); }  // a * b - c
inline float hsum(fvec a) { return _mm512_reduce_add_ps(a); }
inline float hmax(fvec a) { return _mm512_reduce_max_ps(a); }
inline fvec load(const float* p) { return load16(p); }
inline fvec load(const bf16* p) { return load16(p); }
inline fvec load(const fp16* p) { return load16(p); }
inline void store(float* p, fvec v) { store16(p, v); }
inline void store(bf16* p, fvec v) { store16(p, v); }
inline void store(fp16* p, fvec v) { store16(p, v); }
inline fvec exp(fvec x) { return exp16(x); }
// Lane masks: which lanes a select() takes from its first operand.
using mask = __mmask16;
inline mask neq(fvec a, fvec b) { return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ); }
inline fvec select(mask m, fvec a, fvec b) { return _mm512_mask_mov_ps(b, m, a); }  // m ? a : b
inline fvec keep(mask m, fvec a) { return _mm512_maskz_mov_ps(m, a); }  // m ? a : 0
// Lane i set when lo <= first + i < hi.
inline mask lanes_in(int64_t first, int64_t lo, int64_t hi) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo))) &
         _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(hi)));
}
// Lane i of the result = the sum of the kLanes lanes of v[i] (a transpose
// and add tree: ~3 ops per vector instead of a reduction each).
inline fvec transpose_sum(const fvec* v) {
  fvec u[4];
  for (int q = 0; q < 4; ++q) {
    const fvec* w = v + 4 * q;
    fvec t01 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    fvec t23 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
    // Per 128-bit lane: [sum w0, sum w1, sum w2, sum w3] over that lane.
    u[q] = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
  }
  // Sum the four 128-bit lanes of each u[q] into 128-bit lane q of the result.
  fvec x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  fvec x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}
// Even lanes a * b - c, odd lanes a * b + c.
inline fvec fmaddsub(fvec a, fvec b, fvec c) { return _mm512_fmaddsub_ps(a, b, c); }
// Lanes (0 1)(2 3)... swapped within each pair.
inline fvec swap_pairs(fvec a) { return _mm512_permute_ps(a, 0xB1); }
// Each lane of the low (high) half of a, twice: a0 a0 a1 a1 ... (a8 a8 ...).
inline fvec dup_lo(fvec a) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), a);
}
inline fvec dup_hi(fvec a) {
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), a);
}
#else  // VLLM_CPU_AVX2
using fvec = __m256;
constexpr int kLanes = 8;
inline fvec zero() { return _mm256_setzero_ps(); }
inline fvec set1(float a) { return _mm256_set1_ps(a); }
inline fvec add(fvec a, fvec b) { return _mm256_add_ps(a, b); }
inline fvec sub(fvec a, fvec b) { return _mm256_sub_ps(a, b); }
inline fvec mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
inline fvec div(fvec a, fvec b) { return _mm256_div_ps(a, b); }
inline fvec max(fvec a, fvec b) { return _mm256_max_ps(a, b); }
inline fvec fmadd(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
inline fvec fmsub(fvec a, fvec b, fvec c) { return _mm256_fmsub_ps(a, b, c); }
inline fvec fmaddsub(fvec a, fvec b, fvec c) { return _mm256_fmaddsub_ps(a, b, c); }
// Lane masks are all-ones / all-zero lanes (blendv reads the sign bit).
using mask = __m256;
inline mask neq(fvec a, fvec b) { return _mm256_cmp_ps(a, b, _CMP_NEQ_OQ); }
inline fvec select(mask m, fvec a, fvec b) { return _mm256_blendv_ps(b, a, m); }
inline fvec keep(mask m, fvec a) { return _mm256_and_ps(m, a); }
inline mask lanes_in(int64_t first, int64_t lo, int64_t hi) {
  const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_castsi256_ps(
      _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), idx),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), idx)));
}
inline fvec transpose_sum(const fvec* v) {
  // hadd pairs lanes within each 128-bit half: u0 holds, per half, the
  // half-sums of v[0..3], u1 those of v[4..7]; adding the halves finishes.
  fvec u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  fvec u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
inline fvec swap_pairs(fvec a) { return _mm256_permute_ps(a, 0xB1); }
// unpacklo / unpackhi duplicate within 128-bit halves (a0 a0 a1 a1 | a4 a4
// a5 a5, a2 a2 a3 a3 | a6 a6 a7 a7); the half-swap puts them in order.
inline fvec dup_lo(fvec a) {
  return _mm256_permute2f128_ps(_mm256_unpacklo_ps(a, a), _mm256_unpackhi_ps(a, a), 0x20);
}
inline fvec dup_hi(fvec a) {
  return _mm256_permute2f128_ps(_mm256_unpacklo_ps(a, a), _mm256_unpackhi_ps(a, a), 0x31);
}
inline float hsum(fvec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));              // lanes 0+2, 1+3
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));  // + lane 1
}
inline float hmax(fvec a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline fvec load(const float* p) { return _mm256_loadu_ps(p); }
inline fvec load(const bf16* p) {
  // bf16 is the high half of an fp32: widen 8 x u16 to 32 bits, shift by 16.
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline fvec load(const fp16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store(float* p, fvec v) { _mm256_storeu_ps(p, v); }
inline void store(fp16* p, fvec v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
inline void store(bf16* p, fvec v) {
  // Round to nearest even: add 0x7fff + the lsb of the kept half, keep the
  // high 16 bits; NaN lanes become the quiet NaN 0x7fc0 (as c10::BFloat16).
  __m256i bits = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_castps_si256(_mm256_blendv_ps(
      _mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan));
  __m256i high = _mm256_srli_epi32(rounded, 16);  // 0..0xffff: packus is exact
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
// exp on 8 lanes: the same range reduction and polynomial as exp16; 2^n is
// built in the exponent field (n in [-126, 127] after the clamp, so normal).
inline fvec exp(fvec x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// The value of v rounded to T (and back to fp32): what torch computes when
// an intermediate result is stored in T before the next operation.
template <typename T>
inline fvec round_to(fvec v) {
  if constexpr (std::is_same<T, float>::value) {
    return v;
  } else {
    alignas(64) T tmp[kLanes];
    store(tmp, v);
    return load(tmp);
  }
}

}  // namespace simd
#endif  // VLLM_CPU_SIMD

}  // namespace vllm_cpu
