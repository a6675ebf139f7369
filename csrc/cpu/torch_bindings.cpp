// Registers the CPU ops as torch.ops._C_cpu.<name> (schemas mirror upstream's
// where upstream has the op; `paged_attention_decode` is this project's own).
#include <torch/all.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace vllm_cpu {
void paged_attention_decode(torch::Tensor& out, const torch::Tensor& query,
                            const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                            const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                            double scale, int64_t sliding_window, double soft_cap);
void reshape_and_cache(const torch::Tensor& key, const torch::Tensor& value,
                       torch::Tensor& key_cache, torch::Tensor& value_cache,
                       const torch::Tensor& slot_mapping);
void rms_norm(torch::Tensor& out, const torch::Tensor& input, const torch::Tensor& weight,
              double epsilon);
void fused_add_rms_norm(torch::Tensor& input, torch::Tensor& residual, const torch::Tensor& weight,
                        double epsilon);
void fused_add_rms_norm_out(torch::Tensor& out, torch::Tensor& residual_out,
                            const torch::Tensor& input, const torch::Tensor& residual,
                            const torch::Tensor& weight, double epsilon);
void rotary_embedding(const torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      const torch::Tensor& cos_sin_cache, bool is_neox);
void rotary_embedding_out(const torch::Tensor& positions, const torch::Tensor& query,
                          const torch::Tensor& key, int64_t head_size,
                          const torch::Tensor& cos_sin_cache, bool is_neox,
                          torch::Tensor& query_out, torch::Tensor& key_out);
void silu_and_mul(torch::Tensor& out, const torch::Tensor& input);
void apply_token_bitmask(torch::Tensor& logits, const torch::Tensor& bitmask,
                         const torch::Tensor& indices);
torch::Tensor int8_group_gemm(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& scales, int64_t group_size,
                              const std::optional<torch::Tensor>& offsets);
torch::Tensor fp8_weight_gemm(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& scales, int64_t group_size);
std::string quant_gemm_isa();
}  // namespace vllm_cpu

TORCH_LIBRARY(_C_cpu, m) {
  m.def("paged_attention_decode(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, float scale, int sliding_window, float soft_cap) -> ()");
  m.impl("paged_attention_decode", torch::kCPU, &vllm_cpu::paged_attention_decode);
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
        "Tensor slot_mapping) -> ()");
  m.impl("reshape_and_cache", torch::kCPU, &vllm_cpu::reshape_and_cache);
  m.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  m.impl("rms_norm", torch::kCPU, &vllm_cpu::rms_norm);
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  m.impl("fused_add_rms_norm", torch::kCPU, &vllm_cpu::fused_add_rms_norm);
  m.def("fused_add_rms_norm_out(Tensor! out, Tensor! residual_out, Tensor input, Tensor residual, "
        "Tensor weight, float epsilon) -> ()");
  m.impl("fused_add_rms_norm_out", torch::kCPU, &vllm_cpu::fused_add_rms_norm_out);
  m.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.impl("rotary_embedding", torch::kCPU, &vllm_cpu::rotary_embedding);
  m.def("rotary_embedding_out(Tensor positions, Tensor query, Tensor key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox, Tensor! query_out, Tensor! key_out) -> ()");
  m.impl("rotary_embedding_out", torch::kCPU, &vllm_cpu::rotary_embedding_out);
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.impl("silu_and_mul", torch::kCPU, &vllm_cpu::silu_and_mul);
  // Structured outputs (this project's own: upstream masks with xgrammar's kernels).
  m.def("apply_token_bitmask(Tensor! logits, Tensor bitmask, Tensor indices) -> ()");
  m.impl("apply_token_bitmask", torch::kCPU, &vllm_cpu::apply_token_bitmask);
  // Weight-only quantized GEMMs (this project's own schemas; quant_gemm.cpp).
  m.def("int8_group_gemm(Tensor x, Tensor w, Tensor scales, int group_size, Tensor? offsets) "
        "-> Tensor");
  m.impl("int8_group_gemm", torch::kCPU, &vllm_cpu::int8_group_gemm);
  m.def("fp8_weight_gemm(Tensor x, Tensor w, Tensor scales, int group_size) -> Tensor");
  m.impl("fp8_weight_gemm", torch::kCPU, &vllm_cpu::fp8_weight_gemm);
  m.def("quant_gemm_isa() -> str", &vllm_cpu::quant_gemm_isa);
}

// `import vllm._C` loads this library (and so runs the registration above);
// the Python module itself is empty.
#include <Python.h>
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "vllm compiled ops (torch.ops._C_cpu)",
                               -1, nullptr};
  return PyModule_Create(&module);
}
