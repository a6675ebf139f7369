// RMS norm and fused residual-add + RMS norm over rows of [num_tokens, hidden].
// Statistics in fp32; one OpenMP task per chunk of rows.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "cpu_types.h"

namespace vllm_cpu {
namespace {

// Sum of squares of a row (fp32). When `res` is given, x + res is formed
// first (rounded to T, as the unfused path stores it) and written to
// `res_out` (which may alias x or res); the statistics use that stored sum.
template <typename T>
float sum_squares(const T* x, const T* res, T* res_out, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  fvec acc = zero();
  for (; i + kLanes <= n; i += kLanes) {
    fvec v = load(x + i);
    if (res != nullptr) {
      v = round_to<T>(add(v, load(res + i)));  // the sum as stored
      store(res_out + i, v);
    }
    acc = fmadd(v, v, acc);
  }
  total = hsum(acc);
#endif
  for (; i < n; ++i) {
    float v = to_float(x[i]);
    if (res != nullptr) {
      res_out[i] = from_float<T>(v + to_float(res[i]));
      v = to_float(res_out[i]);
    }
    total += v * v;
  }
  return total;
}

// out = src * inv_rms * weight.
template <typename T>
void scale_row(T* out, const T* src, const T* weight, float inv_rms, int64_t n) {
  int64_t i = 0;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  const fvec s = set1(inv_rms);
  for (; i + kLanes <= n; i += kLanes) {
    // Match torch: normalise in fp32, round to T, then multiply by the weight.
    store(out + i, mul(round_to<T>(mul(load(src + i), s)), load(weight + i)));
  }
#endif
  for (; i < n; ++i) {
    T normed = from_float<T>(to_float(src[i]) * inv_rms);
    out[i] = from_float<T>(to_float(normed) * to_float(weight[i]));
  }
}

// Rows of out = rms_norm(in [+ res]); with `res`, the sum goes to res_out.
struct RowPtrs {
  void* out;
  int64_t out_stride;
  const void* in;
  int64_t in_stride;
  const void* res;  // nullptr: plain rms_norm
  int64_t res_stride;
  void* res_out;
  int64_t res_out_stride;
};

template <typename T>
void rms_norm_rows(const RowPtrs& ptr, const T* weight, int64_t rows, int64_t n, double eps) {
  // Small batches (decode) in one task: a parallel region costs more than
  // the work below ~64K elements.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = static_cast<const T*>(ptr.in) + r * ptr.in_stride;
      const T* rr = ptr.res ? static_cast<const T*>(ptr.res) + r * ptr.res_stride : nullptr;
      T* ro = ptr.res ? static_cast<T*>(ptr.res_out) + r * ptr.res_out_stride : nullptr;
      const float ss = sum_squares(x, rr, ro, n);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      scale_row(static_cast<T*>(ptr.out) + r * ptr.out_stride, ro ? ro : x, weight, inv, n);
    }
  });
}

void dispatch_rows(const RowPtrs& ptr, const at::Tensor& input, const at::Tensor& weight,
                   double eps) {
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == input.size(1) &&
                  weight.scalar_type() == input.scalar_type(), "weight must be [hidden] of the input dtype");
  AT_DISPATCH_SWITCH(input.scalar_type(), "rms_norm",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        rms_norm_rows<float>(ptr, weight.data_ptr<float>(), input.size(0), input.size(1), eps);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        rms_norm_rows<bf16>(ptr, weight.data_ptr<bf16>(), input.size(0), input.size(1), eps);
      })
      AT_DISPATCH_CASE(at::ScalarType::Half, [&] {
        rms_norm_rows<fp16>(ptr, weight.data_ptr<fp16>(), input.size(0), input.size(1), eps);
      }));
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be a 2-D [tokens, hidden] tensor "
              "with a contiguous last dim");
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  check_rows(out, "out");
  check_rows(input, "input");
  RowPtrs ptr{out.data_ptr(), out.stride(0), input.data_ptr(), input.stride(0),
              nullptr, 0, nullptr, 0};
  dispatch_rows(ptr, input, weight, epsilon);
}

// In place, as upstream: residual <- input + residual; input <- rms_norm(residual).
void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  check_rows(input, "input");
  check_rows(residual, "residual");
  RowPtrs ptr{input.data_ptr(), input.stride(0), input.data_ptr(), input.stride(0),
              residual.data_ptr(), residual.stride(0), residual.data_ptr(), residual.stride(0)};
  dispatch_rows(ptr, input, weight, epsilon);
}

// Out of place: residual_out <- input + residual; out <- rms_norm(residual_out).
void fused_add_rms_norm_out(at::Tensor& out, at::Tensor& residual_out,
                            const at::Tensor& input, const at::Tensor& residual,
                            const at::Tensor& weight, double epsilon) {
  check_rows(out, "out");
  check_rows(residual_out, "residual_out");
  check_rows(input, "input");
  check_rows(residual, "residual");
  TORCH_CHECK(out.sizes() == input.sizes() && residual.sizes() == input.sizes() &&
                  residual_out.sizes() == input.sizes(), "shape mismatch");
  RowPtrs ptr{out.data_ptr(), out.stride(0), input.data_ptr(), input.stride(0),
              residual.data_ptr(), residual.stride(0), residual_out.data_ptr(), residual_out.stride(0)};
  dispatch_rows(ptr, input, weight, epsilon);
}

}  // namespace vllm_cpu
