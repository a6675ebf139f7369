// Small SIMD helpers shared by the CPU ops: 16 lanes of fp32, loaded from and
// stored to fp32 or bf16 memory.
//
// ISA choice: CMakeLists.txt compiles with -mavx512f/-mavx512bw/-mavx512vl
// (+ -mavx512bf16) only when the *build host* has them (the extension is
// built in place by `pip install -e .`, so build host == run host, as for
// upstream's CPU wheels built per ISA). Every vector path is guarded by the
// matching __AVX512*__ macro and has a scalar fallback that -O3
// auto-vectorises for whatever the host offers.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VLLM_CPU_AVX512 1
#endif

namespace vllm_cpu {

using bf16 = c10::BFloat16;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return static_cast<float>(x); }
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

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
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

}  // namespace vllm_cpu
