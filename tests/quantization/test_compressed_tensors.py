"""compressed-tensors W8A16 (int8 per channel) and W4A16 (int4, groups of 32
and 128, and asymmetric groups of 64) checkpoints, written here as
llm-compressor writes them, run with their weights kept int8 / int4 (torch's
CPU weight-only kernels) and produce transformers' greedy tokens on the
dequantized weights ((q - zp) * scale), under both model runners and at TP=2;
their weights take ~0.5x / <= 0.35x of the same model's bf16 bytes."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_greedy_parity import MAX_TOKENS, _prompts
from tests.quantization.ct_utils import dequantize, pack, quantize, write_compressed
from tests.quantization.quant_test_utils import (
    assert_truncated_refused,
    expected,
    fused_gate_up,
    generate,
    runner_attr,
    tp2_llm,
    weight_bytes,
)
from tests.utils import hf_greedy, make_tiny_model, model_greedy
from vllm import LLM
from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (  # noqa: E501
    unpack_from_int32,
)

# name -> (bits, group size; None: per channel)
SCHEMES = {
    "w8a16": (8, None, True),
    "w4a16-g32": (4, 32, True),
    "w4a16-g128": (4, 128, True),
    "w4a16-g64-asym": (4, 64, False),
}
# hidden 128 so that a group of 128 fits the attention projections.
# Largest reference logit gap allowed where W8A8 and its float emulation part.
MARGIN = 0.02
SHAPES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("bits", [4, 8])
def test_unpack_inverts_the_checkpoint_packing(bits):
    torch.manual_seed(0)
    q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (6, 64), dtype=torch.int8)
    values = unpack_from_int32(pack(q, bits), bits, 64)
    assert torch.equal(values, q.to(torch.int32) + 2 ** (bits - 1))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """scheme -> (quantized dir, dequantized reference dir), one tiny Llama."""
    src = make_tiny_model("llama", str(tmp_path_factory.mktemp("ct-src")), **SHAPES)
    out = {}
    for name, (bits, group, symmetric) in SCHEMES.items():
        dst, ref = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(f"{name}-ref")
        write_compressed(src, str(dst), str(ref), bits, group, symmetric=symmetric)
        out[name] = (str(dst), str(ref))
    return out


@pytest.mark.parametrize("runner", ["0", "1"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_greedy_matches_transformers_on_dequantized_weights(
    checkpoints, monkeypatch, scheme, runner
):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    model_dir, ref_dir = checkpoints[scheme]
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, seed=0)
    assert llm.llm_engine.vllm_config.model_config.quantization == "compressed-tensors"
    assert llm.llm_engine.vllm_config.use_v2_model_runner is (runner == "1")
    # The weights stay low-bit in memory: int8 [out, in] (a float32 model's
    # 4-bit values too, for the int8 group GEMM: utils/int4_cpu.py).
    dtypes = runner_attr(
        llm, lambda r: r.get_model().model.layers[0].mlp.down_proj.weight_packed.dtype
    )
    assert dtypes == [torch.int8]
    assert generate(llm) == expected(ref_dir)


@pytest.mark.parametrize("scheme", ["w8a16", "w4a16-g32", "w4a16-g64-asym"])
def test_tp2_greedy_matches_transformers(checkpoints, scheme):
    """Row-parallel layers split the packed input dim (and the group scales;
    a per-channel scale stays whole), column-parallel ones the output rows."""
    model_dir, ref_dir = checkpoints[scheme]
    llm = tp2_llm(model_dir)
    assert generate(llm) == expected(ref_dir)


def test_weight_bytes_at_load(tmp_path, monkeypatch):
    """Linears dominate this model (4 layers, 1024 intermediate), so the
    whole model's bytes show the ratio; the linear part is checked exactly."""
    shapes = dict(SHAPES, hidden_size=256, intermediate_size=1024, num_hidden_layers=4)
    src = make_tiny_model("llama", str(tmp_path / "src"), **shapes)
    bf16 = weight_bytes(src, monkeypatch)
    h, i, layers = 256, 1024, 4
    kv = h // 4 * 2  # 2 KV heads of 64
    linear_params = layers * (h * (h + 2 * kv) + h * h + 2 * h * i + i * h)
    assert bf16 > 2 * linear_params
    ratios = {}
    for name, bits, group in (("w8a16", 8, None), ("w4a16", 4, 128)):
        dst = str(tmp_path / name)
        write_compressed(src, dst, None, bits, group, scale_dtype=torch.bfloat16)
        ratios[name] = weight_bytes(dst, monkeypatch) / bf16
    # Exactly: the linears' bf16 bytes (2 per weight) become 1 per weight plus
    # a bf16 scale per output row (W8A16), or half a byte per weight plus a
    # bf16 (scale, zero) pair per group of 128 and row (W4A16: torch's int4
    # kernel layout); everything else (embeddings, LM head, norms) is unchanged.
    rows = layers * ((h + 2 * kv) + h + 2 * i + h)
    other = bf16 - 2 * linear_params
    w8 = other + linear_params + 2 * rows
    w4 = other + linear_params // 2 + 4 * linear_params // 128
    assert ratios["w8a16"] == pytest.approx(w8 / bf16, rel=1e-3)
    assert ratios["w4a16"] == pytest.approx(w4 / bf16, rel=1e-3)
    assert 0.45 < ratios["w8a16"] <= 0.56, ratios
    assert ratios["w4a16"] <= 0.35, ratios


def test_ignored_modules_stay_dense(tmp_path, monkeypatch):
    """`ignore` (here every down_proj, by regex) keeps those linears dense
    while the rest are int4; tokens still match transformers."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model("llama", str(tmp_path / "src"), **SHAPES)
    dst, ref = str(tmp_path / "dst"), str(tmp_path / "ref")
    write_compressed(src, dst, ref, 4, 32, ignore=(r".*down_proj$",))
    llm = LLM(model=dst, dtype="float32", max_model_len=128, seed=0)
    (kinds,) = runner_attr(
        llm,
        lambda r: [
            type(layer.quant_method).__name__
            for layer in (
                r.get_model().model.layers[0].mlp.down_proj,
                r.get_model().model.layers[0].mlp.gate_up_proj,
            )
        ],
    )
    assert kinds == ["UnquantizedLinearMethod", "CompressedTensorsLinearMethod"]
    assert generate(llm) == hf_greedy(ref, _prompts(), MAX_TOKENS)


def test_fused_layer_quantized_differently_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model("llama", str(tmp_path / "src"), **SHAPES)
    dst = str(tmp_path / "dst")
    write_compressed(src, dst, None, 8, None, ignore=(r".*q_proj$",))
    with pytest.raises(ValueError, match="fused layer 'model.layers.0.self_attn.qkv_proj'"):
        LLM(model=dst, dtype="float32", max_model_len=128)


def test_architecture_without_quantized_layers_is_refused(tmp_path, monkeypatch):
    """A model class that does not pass the quant config to its linears
    (OPT here) is refused at load, naming it, rather than failing on the
    checkpoint's tensor names."""
    from tests.models.zoo_utils import build_zoo_model
    from tests.quantization.ct_utils import quantization_config
    from tests.quantization.test_quantization_config import _with_quant_config

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = build_zoo_model("opt", str(tmp_path / "src"))
    model = _with_quant_config(src, str(tmp_path / "opt-ct"), quantization_config(8, None))
    with pytest.raises(ValueError, match="OPTForCausalLM does not support quantization method"):
        LLM(model=model, dtype="float32", max_model_len=128)


def _sharpen_logits(tensors: dict) -> None:
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * 30


def _break_checkpoint(model_dir: str, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = f"{model_dir}/model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_bad_checkpoints_are_refused_naming_the_tensor_or_file(tmp_path, monkeypatch):
    """A truncated file, a packed tensor of the wrong shape or of a float
    dtype: a clear error at load naming the file or the tensor."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model("llama", str(tmp_path / "src"), **SHAPES)
    name = "model.layers.1.mlp.down_proj.weight_packed"

    def shrink(t):
        t[name] = t[name][:, :-1].contiguous()

    def as_float(t):
        t[name] = t[name].float()

    cases = {
        "shape": (shrink, rf"tensor '{name}'.*shape \(128, 31\) does not hold 32"),
        "dtype": (as_float, rf"tensor '{name}'.*torch.float32 tensor into a torch.int32"),
    }
    for case, (edit, message) in cases.items():
        dst = str(tmp_path / case)
        write_compressed(src, dst, None, 4, 32)
        _break_checkpoint(dst, edit)
        with pytest.raises(ValueError, match=message):
            LLM(model=dst, dtype="float32", max_model_len=128)
    dst = str(tmp_path / "truncated")
    write_compressed(src, dst, None, 4, 32)
    assert_truncated_refused(dst)


@pytest.mark.parametrize("runner", ["0", "1"])
def test_w8a8_int8_matches_transformers_with_fake_quantized_activations(
    tmp_path, monkeypatch, runner
):
    """W8A8 int8 (int8 x int8 -> int32 GEMM, activations quantized per token
    at run time) gives the tokens of transformers running the dequantized
    weights with each linear's input fake-quantized the same way; the
    weights stay int8."""
    from tests.quantization.ct_utils import hf_act_quant_model, tie_margins, write_w8a8

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    src = make_tiny_model("llama", str(tmp_path / "src"), **SHAPES)
    _break_checkpoint(src, _sharpen_logits)
    dst, ref = str(tmp_path / "w8a8"), str(tmp_path / "ref")
    write_w8a8(src, dst, ref)
    llm = LLM(model=dst, dtype="float32", max_model_len=128, seed=0)
    (dtype,) = runner_attr(llm, lambda r: r.get_model().model.layers[0].mlp.down_proj.weight.dtype)
    assert dtype == torch.int8
    model = hf_act_quant_model(ref)
    got = generate(llm)
    want = model_greedy(model, _prompts(), MAX_TOKENS)
    # Activation rounding amplifies float noise: an activation a hair from a
    # rounding boundary in one implementation (attention or the TP all-reduce
    # summing in another order) lands on the other side in the other, so a
    # near-tie may part the sequences. Where they part, the reference must
    # rate both tokens within MARGIN logits. The LM head is scaled up 30x so
    # that ties are rare and an error shows: measured, the correct kernel
    # parts once at a gap of 0.009; one scale per batch instead of per token
    # parts 4 of 8 at gaps of 0.036-0.149. The GEMM is checked exactly below.
    margins = tie_margins(model, _prompts(), got, want)
    assert all(0 <= m < MARGIN for m in margins), margins


def test_w8a8_int8_gemm_is_exact():
    """The int8 x int8 GEMM equals the float product of the per-token
    fake-quantized input and the dequantized weight (to float32 rounding)."""
    from tests.quantization.ct_utils import w8a8_quantization_config
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    torch.manual_seed(0)
    config = CompressedTensorsConfig.from_config(w8a8_quantization_config())
    layer = fused_gate_up(config, 64, [48, 80])
    ws = [torch.randn(n, 64) for n in (48, 80)]
    for shard, w in enumerate(ws):
        q, scale = quantize(w, 8, None)
        layer.weight.weight_loader(layer.weight, q, shard)
        layer.weight_scale.weight_loader(layer.weight_scale, scale, shard)
    layer.bias.data.copy_(torch.randn(128))
    layer.process_weights_after_loading(torch.float32)
    x = torch.randn(5, 64) * 3
    y, _ = layer(x)
    s = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(x / s).clamp(-128, 127) * s
    wd = torch.cat([dequantize(*quantize(w, 8, None)) for w in ws])
    torch.testing.assert_close(
        y, xq.double().matmul(wd.double().t()).float() + layer.bias, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_llama_family_variants(tmp_path, monkeypatch, kind):
    """Qwen2 (q/k/v biases added after the int4 GEMM) and Qwen3 (q/k norms)
    take the quantized linears too."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model(kind, str(tmp_path / "src"), **SHAPES)
    dst, ref = str(tmp_path / "dst"), str(tmp_path / "ref")
    write_compressed(src, dst, ref, 4, 32)
    llm = LLM(model=dst, dtype="float32", max_model_len=128, seed=0)
    (has_bias,) = runner_attr(
        llm, lambda r: r.get_model().model.layers[0].self_attn.qkv_proj.bias is not None
    )
    assert has_bias is (kind == "qwen2")
    assert generate(llm) == hf_greedy(ref, _prompts(), MAX_TOKENS)
