// Dense GEMM over a panel-packed weight: out[M, N] = x[M, K] @ W.T (+ bias),
// for float32, bfloat16 and float16 weights (x and out in the same dtype),
// accumulated in fp32.
//
// Why: on CPUs with AVX2 but no AVX-512 (AMD EPYC Zen 2/3 among them) a
// batch-1 decode step is one pass over every weight. oneDNN's packed GEMV
// reads fp32 weights at ~28 GB/s there, this loop at ~34 GB/s (391 MB of a
// 120M model's projections, 2 threads), and its register tile keeps pace
// with oneDNN at prefill sizes (~190 GFLOP/s, the 2-core FMA peak). oneDNN's
// bf16 / fp16 GEMMs have no fast path without AVX-512-BF16 / AMX (minutes
// where fp32 takes seconds); here 16-bit weights are widened in registers
// (bf16: a 16-bit shift; fp16: F16C), so they cost half the memory traffic
// of fp32 and the same FMAs. vllm/model_executor/layers/utils.py packs
// weights this way only where the ops run their AVX2 build.
//
// Layout (`pack_panels`, done once in Python): P[j][k][c] = W[16 j + c][k],
// shape [N / 16, K, 16]. A panel holds 16 output columns k-major, so one k
// step of a panel is 16 contiguous weights (two ymm of fp32 once widened),
// and a thread's panels are one sequential stream: the hardware prefetcher's
// best case for decode.
//
// Schedule: threads split the panels. For each block of kMC x rows, each of
// the thread's panels and each kKC slice of K, register tiles of kMR x rows
// by 16 columns (kMR x 2 accumulators) walk the slice: the panel slice
// (kKC x 16 weights <= 16 KiB) stays in L1 and the x block (kMC x kKC x 4 B
// = 96 KiB) in L2 while every x row of the block reuses it. x and the bias
// are converted to fp32 first (M x K, negligible next to K x N); a 16-bit
// output is rounded from the fp32 result at the end (as torch's GEMMs round).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VLLM_GEMM_AVX2 1
#endif

namespace vllm_cpu {
namespace panel {

constexpr int64_t kNB = 16;   // panel width: the packed layout's, two ymm
constexpr int kMR = 6;        // 6 x 2 accumulators + 2 weight + 1 x register = 15 of 16 ymm
constexpr int64_t kKC = 256;  // 256 k x 64 B = 16 KiB of panel: L1 (32 KiB on Zen 3)
constexpr int64_t kMC = 96;   // 96 rows x 256 k x 4 B = 96 KiB of x: L2 (512 KiB)

template <typename WT>
struct Gemm {
  const float* x;     // [M, K] contiguous
  const WT* p;        // [N / 16, K, 16]
  const float* bias;  // [N] or nullptr
  float* out;         // [M, N] contiguous
  int64_t M, N, K;
};

#ifdef VLLM_GEMM_AVX2
// 16 weights of a panel row -> two fp32 ymm.
inline void load16(const float* p, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(p);
  hi = _mm256_loadu_ps(p + 8);
}
inline void load16(const c10::BFloat16* p, __m256& lo, __m256& hi) {
  // bf16 is the high half of an fp32: widen to 32 bits, shift left by 16.
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
  hi = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
}
inline void load16(const c10::Half* p, __m256& lo, __m256& hi) {
  lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
}

// out rows m .. m + MR, columns 16 j .. 16 j + 16, over k0 .. k0 + kc. The
// first slice starts from the bias (or zero), later ones from the partial
// sums in out.
// w: the panel's fp32 slice for k0 .. k0 + kc ([kc, 16]).
template <int MR, typename WT>
inline void tile(const Gemm<WT>& g, const float* w, int64_t m, int64_t j, int64_t k0,
                 int64_t kc) {
  // Where the sums start: out's partial sums, else the bias row (the same
  // for every x row: stride 0), else zeros. One uniform load keeps acc in
  // registers (branches per row made GCC keep it in memory).
  alignas(32) static constexpr float kZeros[kNB] = {};
  float* c = g.out + m * g.N + j * kNB;
  const float* init = k0 > 0 ? c : (g.bias != nullptr ? g.bias + j * kNB : kZeros);
  const int64_t init_stride = k0 > 0 ? g.N : 0;
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm256_loadu_ps(init + r * init_stride);
    acc[r][1] = _mm256_loadu_ps(init + r * init_stride + 8);
  }
  const float* x = g.x + m * g.K + k0;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kNB);
    const __m256 w1 = _mm256_loadu_ps(w + k * kNB + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * g.K + k);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * g.N, acc[r][0]);
    _mm256_storeu_ps(c + r * g.N + 8, acc[r][1]);
  }
}

// One x row (decode): two chains of 2 FMAs would wait on the FMA latency
// (4 cycles), so even and odd k accumulate apart and meet at the end.
template <typename WT>
inline void row(const Gemm<WT>& g, int64_t m, int64_t j) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  const WT* w = g.p + j * g.K * kNB;
  const float* x = g.x + m * g.K;
  __m256 w0, w1, w2, w3;
  int64_t k = 0;
  for (; k + 2 <= g.K; k += 2) {
    const __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
    load16(w + k * kNB, w0, w1);
    load16(w + (k + 1) * kNB, w2, w3);
    a0 = _mm256_fmadd_ps(x0, w0, a0);
    a1 = _mm256_fmadd_ps(x0, w1, a1);
    b0 = _mm256_fmadd_ps(x1, w2, b0);
    b1 = _mm256_fmadd_ps(x1, w3, b1);
  }
  if (k < g.K) {
    const __m256 x0 = _mm256_broadcast_ss(x + k);
    load16(w + k * kNB, w0, w1);
    a0 = _mm256_fmadd_ps(x0, w0, a0);
    a1 = _mm256_fmadd_ps(x0, w1, a1);
  }
  a0 = _mm256_add_ps(a0, b0);
  a1 = _mm256_add_ps(a1, b1);
  if (g.bias != nullptr) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(g.bias + j * kNB));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(g.bias + j * kNB + 8));
  }
  float* c = g.out + m * g.N + j * kNB;
  _mm256_storeu_ps(c, a0);
  _mm256_storeu_ps(c + 8, a1);
}

template <typename WT>
inline void tile_rows(const Gemm<WT>& g, const float* w, int64_t m, int rows, int64_t j,
                      int64_t k0, int64_t kc) {
  switch (rows) {
    case 6: return tile<6>(g, w, m, j, k0, kc);
    case 5: return tile<5>(g, w, m, j, k0, kc);
    case 4: return tile<4>(g, w, m, j, k0, kc);
    case 3: return tile<3>(g, w, m, j, k0, kc);
    case 2: return tile<2>(g, w, m, j, k0, kc);
    default: return tile<1>(g, w, m, j, k0, kc);
  }
}

// The fp32 slice of panel j at k0 .. k0 + kc: in place for fp32 weights;
// 16-bit ones are widened once into `buf` (L1-sized), which all the x rows'
// tiles then reuse (widening inside the tile would need a 16th register).
template <typename WT>
inline const float* panel_slice(const Gemm<WT>& g, int64_t j, int64_t k0, int64_t kc,
                                float* buf) {
  const WT* w = g.p + (j * g.K + k0) * kNB;
  if constexpr (std::is_same_v<WT, float>) {
    return w;
  } else {
    for (int64_t k = 0; k < kc; ++k) {
      __m256 lo, hi;
      load16(w + k * kNB, lo, hi);
      _mm256_storeu_ps(buf + k * kNB, lo);
      _mm256_storeu_ps(buf + k * kNB + 8, hi);
    }
    return buf;
  }
}

template <typename WT>
void panels(const Gemm<WT>& g, int64_t j_begin, int64_t j_end) {
  if (g.M == 1) {
    for (int64_t j = j_begin; j < j_end; ++j) row(g, 0, j);
    return;
  }
  alignas(64) float buf[kKC * kNB];
  for (int64_t m0 = 0; m0 < g.M; m0 += kMC) {
    const int64_t m1 = std::min(g.M, m0 + kMC);
    for (int64_t j = j_begin; j < j_end; ++j) {
      for (int64_t k0 = 0; k0 < g.K; k0 += kKC) {
        const int64_t kc = std::min(kKC, g.K - k0);
        const float* w = panel_slice(g, j, k0, kc, buf);
        for (int64_t m = m0; m < m1; m += kMR) {
          tile_rows(g, w, m, static_cast<int>(std::min<int64_t>(kMR, m1 - m)), j, k0, kc);
        }
      }
    }
  }
}
#else
// Scalar reference of the same layout (builds without AVX2 + FMA).
template <typename WT>
void panels(const Gemm<WT>& g, int64_t j_begin, int64_t j_end) {
  for (int64_t m = 0; m < g.M; ++m) {
    for (int64_t j = j_begin; j < j_end; ++j) {
      for (int64_t c = 0; c < kNB; ++c) {
        float acc = g.bias != nullptr ? g.bias[j * kNB + c] : 0.f;
        for (int64_t k = 0; k < g.K; ++k) {
          acc += g.x[m * g.K + k] * static_cast<float>(g.p[(j * g.K + k) * kNB + c]);
        }
        g.out[m * g.N + j * kNB + c] = acc;
      }
    }
  }
}
#endif

}  // namespace panel

at::Tensor panel_gemm(const at::Tensor& x, const at::Tensor& packed,
                      const std::optional<at::Tensor>& bias) {
  constexpr int64_t kNB = panel::kNB;
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "panel_gemm: the packed weight must be float32, bfloat16 or float16");
  TORCH_CHECK(x.scalar_type() == dtype, "panel_gemm: x is ", x.scalar_type(),
              ", the packed weight ", dtype);
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kNB && packed.is_contiguous(),
              "panel_gemm: the packed weight must be a contiguous [N / 16, K, 16] tensor");
  const int64_t K = packed.size(1), N = packed.size(0) * kNB;
  TORCH_CHECK(x.size(-1) == K, "panel_gemm: x has ", x.size(-1), " features, the weight ", K);
  const at::Tensor x32 = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = x32.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor out32 = at::empty({M, N}, x32.options());
  at::Tensor bias32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "panel_gemm: bias must have ", N, " elements");
    bias32 = bias->to(at::kFloat).contiguous();
  }
  const float* b = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
  auto run = [&](auto* p) {
    using WT = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    const panel::Gemm<WT> g{x32.data_ptr<float>(), p, b, out32.data_ptr<float>(), M, N, K};
    // Grain: panels per task, so that a small layer (N = 768: 48 panels)
    // still splits across the threads while each task streams >= 4 panels.
    at::parallel_for(0, N / kNB, 4,
                     [&](int64_t begin, int64_t end) { panel::panels(g, begin, end); });
  };
  if (M > 0) {
    if (dtype == at::kFloat) {
      run(packed.data_ptr<float>());
    } else if (dtype == at::kBFloat16) {
      run(reinterpret_cast<const c10::BFloat16*>(packed.data_ptr()));
    } else {
      run(reinterpret_cast<const c10::Half*>(packed.data_ptr()));
    }
  }
  return out32.to(dtype).view(out_shape);
}

}  // namespace vllm_cpu
