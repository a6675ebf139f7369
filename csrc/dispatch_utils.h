// Host-side dtype dispatch for the CUDA ops (upstream: csrc/dispatch_utils.h).
// Inside the lambda `scalar_t` is the c10 type; `vllm::cuda_t<scalar_t>` is
// the CUDA type of the same layout (__half, __nv_bfloat16, float).
#pragma once

#include <ATen/Dispatch.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define VLLM_DISPATCH_CASE_FLOATING_TYPES(...)           \
  AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
  AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
  AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__)

#define VLLM_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, VLLM_DISPATCH_CASE_FLOATING_TYPES(__VA_ARGS__))

namespace vllm {
template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<c10::Half> {
  using type = __half;
};
template <>
struct CudaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using cuda_t = typename CudaType<T>::type;
}  // namespace vllm
