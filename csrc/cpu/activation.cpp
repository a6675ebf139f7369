// silu_and_mul: out[..., d] = silu(x[..., :d]) * x[..., d:], fp32 math, one pass.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "cpu_types.h"

namespace vllm_cpu {
namespace {

template <typename T>
void silu_and_mul_rows(T* out, int64_t out_stride, const T* in, int64_t in_stride, int64_t rows,
                       int64_t d) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = in + r * in_stride;
      const T* up = gate + d;
      T* o = out + r * out_stride;
      int64_t i = 0;
#ifdef VLLM_CPU_SIMD
      using namespace simd;
      const fvec one = set1(1.f);
      for (; i + kLanes <= d; i += kLanes) {
        fvec g = load(gate + i);
        // silu(g) = g / (1 + exp(-g)), rounded to T before the product like torch.
        fvec s = round_to<T>(div(g, add(one, exp(sub(zero(), g)))));
        store(o + i, mul(s, load(up + i)));
      }
#endif
      for (; i < d; ++i) {
        const float g = to_float(gate[i]);
        const T s = from_float<T>(g / (1.f + std::exp(-g)));
        o[i] = from_float<T>(to_float(s) * to_float(up[i]));
      }
    }
  });
}

}  // namespace

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(input.stride(-1) == 1 && out.stride(-1) == 1 && out.size(-1) == d,
              "silu_and_mul: input [..., 2d] and out [..., d] with a contiguous last dim");
  auto in2 = input.view({-1, input.size(-1)});
  auto out2 = out.view({-1, d});
  AT_DISPATCH_SWITCH(input.scalar_type(), "silu_and_mul",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        silu_and_mul_rows<float>(out2.data_ptr<float>(), out2.stride(0), in2.data_ptr<float>(),
                                 in2.stride(0), in2.size(0), d);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        silu_and_mul_rows<bf16>(out2.data_ptr<bf16>(), out2.stride(0), in2.data_ptr<bf16>(),
                                in2.stride(0), in2.size(0), d);
      })
      AT_DISPATCH_CASE(at::ScalarType::Half, [&] {
        silu_and_mul_rows<fp16>(out2.data_ptr<fp16>(), out2.stride(0), in2.data_ptr<fp16>(),
                                in2.stride(0), in2.size(0), d);
      }));
}

}  // namespace vllm_cpu
