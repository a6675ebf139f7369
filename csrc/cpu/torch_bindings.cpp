// Registers the CPU ops as torch.ops._C_cpu.<name> (schemas mirror upstream's
// where upstream has the op; `paged_attention_decode` is this project's own).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "cpu_types.h"

namespace vllm_cpu {
void paged_attention_decode(at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& key_cache, const at::Tensor& value_cache,
                            const at::Tensor& block_table, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, double soft_cap);
void reshape_and_cache(const at::Tensor& key, const at::Tensor& value,
                       at::Tensor& key_cache, at::Tensor& value_cache,
                       const at::Tensor& slot_mapping);
void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon);
void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon);
void fused_add_rms_norm_out(at::Tensor& out, at::Tensor& residual_out,
                            const at::Tensor& input, const at::Tensor& residual,
                            const at::Tensor& weight, double epsilon);
void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox);
void rotary_embedding_out(const at::Tensor& positions, const at::Tensor& query,
                          const at::Tensor& key, int64_t head_size,
                          const at::Tensor& cos_sin_cache, bool is_neox,
                          at::Tensor& query_out, at::Tensor& key_out);
void silu_and_mul(at::Tensor& out, const at::Tensor& input);
void apply_token_bitmask(at::Tensor& logits, const at::Tensor& bitmask,
                         const at::Tensor& indices);
at::Tensor int8_group_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size,
                              const std::optional<at::Tensor>& offsets);
at::Tensor fp8_weight_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size);
std::string quant_gemm_isa();
void gumbel_argmax(const at::Tensor& logits, const at::Tensor& keys, at::Tensor& out);
at::Tensor panel_gemm(const at::Tensor& x, const at::Tensor& packed,
                      const std::optional<at::Tensor>& bias);
// The vector path cpu_types.h chose for the ops of this build (the ISA
// variant: avx512_bf16, avx512, avx2 or scalar).
inline std::string cpu_ops_isa() { return kCpuIsa; }
}  // namespace vllm_cpu

// tests/kernels/test_cpu_ops_isa.py compiles csrc/cpu with other ISA flags
// into a library of its own, registered under another namespace so that it
// loads beside vllm._C.
#ifndef VLLM_CPU_OPS_NAMESPACE
#define VLLM_CPU_OPS_NAMESPACE _C_cpu
#endif

TORCH_LIBRARY(VLLM_CPU_OPS_NAMESPACE, m) {
  m.def("paged_attention_decode(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, float scale, int sliding_window, float soft_cap) -> ()");
  m.impl("paged_attention_decode", at::kCPU, &vllm_cpu::paged_attention_decode);
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
        "Tensor slot_mapping) -> ()");
  m.impl("reshape_and_cache", at::kCPU, &vllm_cpu::reshape_and_cache);
  m.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  m.impl("rms_norm", at::kCPU, &vllm_cpu::rms_norm);
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  m.impl("fused_add_rms_norm", at::kCPU, &vllm_cpu::fused_add_rms_norm);
  m.def("fused_add_rms_norm_out(Tensor! out, Tensor! residual_out, Tensor input, Tensor residual, "
        "Tensor weight, float epsilon) -> ()");
  m.impl("fused_add_rms_norm_out", at::kCPU, &vllm_cpu::fused_add_rms_norm_out);
  m.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.impl("rotary_embedding", at::kCPU, &vllm_cpu::rotary_embedding);
  m.def("rotary_embedding_out(Tensor positions, Tensor query, Tensor key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox, Tensor! query_out, Tensor! key_out) -> ()");
  m.impl("rotary_embedding_out", at::kCPU, &vllm_cpu::rotary_embedding_out);
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.impl("silu_and_mul", at::kCPU, &vllm_cpu::silu_and_mul);
  // Structured outputs (this project's own: upstream masks with xgrammar's kernels).
  m.def("apply_token_bitmask(Tensor! logits, Tensor bitmask, Tensor indices) -> ()");
  m.impl("apply_token_bitmask", at::kCPU, &vllm_cpu::apply_token_bitmask);
  // Weight-only quantized GEMMs (this project's own schemas; quant_gemm.cpp).
  m.def("int8_group_gemm(Tensor x, Tensor w, Tensor scales, int group_size, Tensor? offsets) "
        "-> Tensor");
  m.impl("int8_group_gemm", at::kCPU, &vllm_cpu::int8_group_gemm);
  m.def("fp8_weight_gemm(Tensor x, Tensor w, Tensor scales, int group_size) -> Tensor");
  m.impl("fp8_weight_gemm", at::kCPU, &vllm_cpu::fp8_weight_gemm);
  m.def("quant_gemm_isa() -> str", &vllm_cpu::quant_gemm_isa);
  // The sampler's Gumbel-max draw (this project's own; sampling.cpp).
  m.def("gumbel_argmax(Tensor logits, Tensor keys, Tensor! out) -> ()");
  m.impl("gumbel_argmax", at::kCPU, &vllm_cpu::gumbel_argmax);
  // Dense GEMM over panel-packed weights (this project's own; gemm_panel.cpp).
  m.def("panel_gemm(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.impl("panel_gemm", at::kCPU, &vllm_cpu::panel_gemm);
  // The vector path the other ops were compiled with: avx512_bf16 / avx512 / avx2 / scalar.
  m.def("cpu_ops_isa() -> str", &vllm_cpu::cpu_ops_isa);
}

// `import vllm._C` (or vllm._C_avx2, ...: one module per ISA, CMakeLists.txt
// names each by TORCH_EXTENSION_NAME) loads this library and so runs the
// registration above; the Python module itself is empty.
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _C
#endif
#define VLLM_CONCAT_(a, b) a##b
#define VLLM_CONCAT(a, b) VLLM_CONCAT_(a, b)
#define VLLM_STR_(a) #a
#define VLLM_STR(a) VLLM_STR_(a)
#include <Python.h>
extern "C" PyObject* VLLM_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, VLLM_STR(TORCH_EXTENSION_NAME),
                               "vllm compiled ops (torch.ops._C_cpu)", -1, nullptr};
  return PyModule_Create(&module);
}
