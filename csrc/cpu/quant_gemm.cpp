// Weight-only quantized GEMM: out[M, N] = x[M, K] @ W.T with W kept low-bit,
//   W[n, k] = scales[n, k / g] * decode(w[n, k]) (+ offsets[n, k / g]).
// decode is the template parameter: int8 (sign-extend; GGUF Q8_0 / Q6_K /
// Q5_x after unpacking) or float8_e4m3fn (compressed-tensors / block FP8).
// fp32 accumulation; the per-group scale multiplies each group's dot product
// once (a vector FMA per group), offsets add offsets[n, g] * sum(x over g).
//
// Two schedules:
//  - small M (decode, memory-bound): each weight row is read once for all M
//    rows; M is processed in register tiles of kMaxMT rows while the row
//    (K bytes) stays in L1, so the weight stream dominates.
//  - large M (prefill, compute-bound): dequantize a block of rows to fp32 in
//    parallel, then one BLAS sgemm (at::mm) reuses it across all M rows.
// Vector paths: AVX-512 (VLLM_CPU_AVX512), AVX2 + FMA + F16C, else scalar;
// the build picks one from the compiler flags (CMakeLists.txt).
// Per-operator ATen headers instead of torch/all.h: the test compiles this
// file alone (twice) and the full header costs most of that time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "cpu_types.h"

#if !defined(VLLM_CPU_AVX512) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VLLM_QG_AVX2 1
#endif

namespace vllm_cpu {
namespace {

// e4m3fn byte: s eeee mmm (bias 7). Moving its 7 low bits up by 7 gives the
// fp16 pattern 0 0eeee mmm0000000 (bias 15), i.e. the same value times 2^-8,
// exactly: normals keep their mantissa, and e4m3 subnormals (eeee = 0,
// 2^-6 * 0.mmm) land on fp16 subnormals (2^-14 * 0.mmm), also x 2^-8, so no
// flush-to-zero can hit them in fp32. The 2^8 is folded into the group
// scale (kScale). The sign goes from bit 7 to bit 15. The two NaN bytes
// (0x7f, 0xff) decode as +-480 (checkpoints do not hold NaN weights).
inline uint16_t e4m3_to_half_bits(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80) << 8) | ((b & 0x7f) << 7));
}

// ------------------------------------------------------------ vector layer
#if defined(VLLM_CPU_AVX512)
constexpr const char* kIsa = "avx512";
constexpr int kMaxMT = 8;  // 8 group + 8 row accumulators of 32 zmm
struct Vec {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V a) { return _mm512_reduce_add_ps(a); }
  static V from_i8(const int8_t* p) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  static V from_e4m3(const uint8_t* p) {
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i mag = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7);
    __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
    return _mm512_cvtph_ps(_mm256_or_si256(mag, sign));
  }
};
#elif defined(VLLM_QG_AVX2)
constexpr const char* kIsa = "avx2";
constexpr int kMaxMT = 4;  // 16 ymm registers
struct Vec {
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static V from_i8(const int8_t* p) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  static V from_e4m3(const uint8_t* p) {
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m128i mag = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7);
    __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    return _mm256_cvtph_ps(_mm_or_si128(mag, sign));
  }
};
#else
constexpr const char* kIsa = "scalar";
constexpr int kMaxMT = 4;
struct Vec {  // one lane: the same kernel as plain loops
  using V = float;
  static constexpr int W = 1;
  static V zero() { return 0.f; }
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float sum(V a) { return a; }
  static V from_i8(const int8_t* p) { return static_cast<float>(*p); }
  static V from_e4m3(const uint8_t* p) {
    return static_cast<float>(c10::Half(e4m3_to_half_bits(*p), c10::Half::from_bits()));
  }
};
#endif

// ------------------------------------------------------------- decoders
struct Int8Dec {
  using WT = int8_t;
  static constexpr float kScale = 1.f;
  static Vec::V load(const WT* p) { return Vec::from_i8(p); }
  static float scalar(WT b) { return static_cast<float>(b); }
};
struct E4m3Dec {
  using WT = uint8_t;
  static constexpr float kScale = 256.f;  // the 2^8 of e4m3_to_half_bits
  static Vec::V load(const WT* p) { return Vec::from_e4m3(p); }
  static float scalar(WT b) {
    return static_cast<float>(c10::Half(e4m3_to_half_bits(b), c10::Half::from_bits()));
  }
};

struct Problem {
  const float* x;        // [M, K] fp32, contiguous
  const void* w;         // [N, K] weight bytes
  const float* scales;   // [N, G]
  const float* offsets;  // [N, G] or nullptr
  const float* xsum;     // [M, G] sums of x over each group (with offsets)
  int64_t M, N, K, g;
};

// Rows [n0, n1) of out [M, N] for x rows [m0, m0 + MT): register tile MT.
template <class Dec, int MT>
void row_tile(const Problem& p, int64_t n, int64_t m0, float* out) {
  using V = Vec::V;
  const auto* wr = static_cast<const typename Dec::WT*>(p.w) + n * p.K;
  const int64_t G = p.K / p.g;
  const float* sr = p.scales + n * G;
  const float* x = p.x + m0 * p.K;
  V acc[MT];
  float extra[MT];
  for (int m = 0; m < MT; ++m) acc[m] = Vec::zero(), extra[m] = 0.f;
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t k0 = gi * p.g;
    V gd[MT];
    for (int m = 0; m < MT; ++m) gd[m] = Vec::zero();
    int64_t j = k0;
    for (; j + Vec::W <= k0 + p.g; j += Vec::W) {
      const V wv = Dec::load(wr + j);
      for (int m = 0; m < MT; ++m) gd[m] = Vec::fma(Vec::load(x + m * p.K + j), wv, gd[m]);
    }
    const float s = sr[gi] * Dec::kScale;
    float tail[MT] = {};
    for (; j < k0 + p.g; ++j) {  // a group that is not a multiple of the width
      const float wv = Dec::scalar(wr[j]);
      for (int m = 0; m < MT; ++m) tail[m] += x[m * p.K + j] * wv;
    }
    const V sv = Vec::set1(s);
    for (int m = 0; m < MT; ++m) {
      acc[m] = Vec::fma(sv, gd[m], acc[m]);
      extra[m] += s * tail[m];
      if (p.offsets != nullptr) extra[m] += p.offsets[n * G + gi] * p.xsum[(m0 + m) * G + gi];
    }
  }
  for (int m = 0; m < MT; ++m) out[(m0 + m) * p.N + n] = Vec::sum(acc[m]) + extra[m];
}

template <class Dec, int MT>
void row_tail(const Problem& p, int64_t n, int64_t m0, int64_t rows, float* out) {
  if constexpr (MT > 1) {
    if (rows < MT) return row_tail<Dec, MT - 1>(p, n, m0, rows, out);
  }
  row_tile<Dec, MT>(p, n, m0, out);
}

// Small M: threads split N; each weight row is streamed once and reused
// (from L1) by every register tile of x rows.
template <class Dec>
void gemm_small_m(const Problem& p, float* out) {
  const int64_t grain = std::max<int64_t>(4, 32768 / std::max<int64_t>(p.K, 1));
  at::parallel_for(0, p.N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      int64_t m = 0;
      for (; m + kMaxMT <= p.M; m += kMaxMT) row_tile<Dec, kMaxMT>(p, n, m, out);
      if (m < p.M) row_tail<Dec, kMaxMT>(p, n, m, p.M - m, out);
    }
  });
}

// One weight row to fp32 (scales and offsets applied) into dst[K].
template <class Dec>
void dequant_row(const Problem& p, int64_t n, float* dst) {
  const auto* wr = static_cast<const typename Dec::WT*>(p.w) + n * p.K;
  const int64_t G = p.K / p.g;
  for (int64_t gi = 0; gi < G; ++gi) {
    const float s = p.scales[n * G + gi] * Dec::kScale;
    const float o = p.offsets != nullptr ? p.offsets[n * G + gi] : 0.f;
    const Vec::V sv = Vec::set1(s), ov = Vec::set1(o);
    int64_t j = gi * p.g;
    const int64_t end = j + p.g;
    for (; j + Vec::W <= end; j += Vec::W) Vec::store(dst + j, Vec::fma(Dec::load(wr + j), sv, ov));
    for (; j < end; ++j) dst[j] = Dec::scalar(wr[j]) * s + o;
  }
}

// Large M: blocks of rows dequantized to fp32 (in parallel), then
// outT[block] = Wblock @ x.T by BLAS; the dense weight is never held whole.
template <class Dec>
void gemm_large_m(const Problem& p, const at::Tensor& x, at::Tensor& out_t) {
  const int64_t rows = std::clamp<int64_t>((int64_t{1} << 20) / p.K, 64, 1024);
  auto wbuf = at::empty({std::min(rows, p.N), p.K}, x.options());
  float* wb = wbuf.data_ptr<float>();
  for (int64_t b0 = 0; b0 < p.N; b0 += rows) {
    const int64_t nb = std::min(rows, p.N - b0);
    at::parallel_for(0, nb, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) dequant_row<Dec>(p, b0 + r, wb + r * p.K);
    });
    auto dst = out_t.narrow(0, b0, nb);
    at::mm_out(dst, wbuf.narrow(0, 0, nb), x.t());
  }
}

// Above this many x rows the dequantize + sgemm schedule wins (benchmark:
// benchmarks/benchmark_quant_gemm.py).
constexpr int64_t kLargeM = 16;

template <class Dec>
at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& scales, int64_t group_size,
                         const std::optional<at::Tensor>& offsets, const char* name) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), name,
              ": x [M, K] and w [N, K] expected, got ", x.sizes(), " and ", w.sizes());
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  TORCH_CHECK(group_size > 0 && K % group_size == 0, name, ": group_size ", group_size,
              " does not divide K = ", K);
  const int64_t G = K / group_size;
  TORCH_CHECK(w.is_contiguous() && scales.is_contiguous() && scales.scalar_type() == at::kFloat &&
                  scales.size(0) == N && scales.size(1) == G,
              name, ": contiguous w and float32 scales [N, K / group_size] expected");
  auto xf = x.to(at::kFloat).contiguous();
  at::Tensor xsum;
  Problem p{xf.data_ptr<float>(), w.data_ptr(), scales.data_ptr<float>(), nullptr, nullptr,
            M, N, K, group_size};
  if (offsets.has_value()) {
    const auto& o = *offsets;
    TORCH_CHECK(o.is_contiguous() && o.scalar_type() == at::kFloat && o.size(0) == N &&
                    o.size(1) == G,
                name, ": offsets must be contiguous float32 [N, K / group_size]");
    p.offsets = o.data_ptr<float>();
    xsum = xf.view({M, G, group_size}).sum(-1).contiguous();
    p.xsum = xsum.data_ptr<float>();
  }
  if (M == 0 || N == 0) return at::zeros({M, N}, x.options());
  if (M > kLargeM) {
    auto out_t = at::empty({N, M}, xf.options());
    gemm_large_m<Dec>(p, xf, out_t);
    return out_t.t().to(x.scalar_type()).contiguous();
  }
  auto out = at::empty({M, N}, xf.options());
  gemm_small_m<Dec>(p, out.data_ptr<float>());
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor int8_group_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size,
                              const std::optional<at::Tensor>& offsets) {
  TORCH_CHECK(w.scalar_type() == at::kChar, "int8_group_gemm: w must be int8");
  return quant_gemm<Int8Dec>(x, w, scales, group_size, offsets, "int8_group_gemm");
}

at::Tensor fp8_weight_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size) {
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn, "fp8_weight_gemm: w must be float8_e4m3fn");
  return quant_gemm<E4m3Dec>(x, w, scales, group_size, std::nullopt, "fp8_weight_gemm");
}

// Which vector path this build compiled ("avx512", "avx2" or "scalar").
std::string quant_gemm_isa() { return kIsa; }

}  // namespace vllm_cpu

#ifdef VLLM_QUANT_GEMM_STANDALONE
// tests/kernels/test_quant_gemm.py compiles this file alone with other ISA
// flags and registers the ops under a namespace of its own.
TORCH_LIBRARY(VLLM_QUANT_GEMM_STANDALONE, m) {
  m.def("int8_group_gemm(Tensor x, Tensor w, Tensor scales, int group_size, Tensor? offsets) "
        "-> Tensor");
  m.impl("int8_group_gemm", at::kCPU, &vllm_cpu::int8_group_gemm);
  m.def("fp8_weight_gemm(Tensor x, Tensor w, Tensor scales, int group_size) -> Tensor");
  m.impl("fp8_weight_gemm", at::kCPU, &vllm_cpu::fp8_weight_gemm);
  m.def("quant_gemm_isa() -> str", &vllm_cpu::quant_gemm_isa);
}
#endif
