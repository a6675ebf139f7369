"""GGUF kept quantized: tiny Llama .gguf files written here (gguf-py's own
quantizer for Q4_0 / Q8_0; random blocks for the K-quants, which it cannot
quantize) run with their weights kept 4-bit / 8-bit and produce the greedy
tokens of transformers on the same file's weights as gguf-py dequantizes
them, under both model runners and at TP=2; the decode of every built type
equals gguf-py's `dequantize` bit for bit; a Q4_0 model takes <= 0.35x of its
bf16 bytes; a truncated file and an unbuilt type are refused at start-up by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.test_greedy_parity import MAX_TOKENS, _prompts
from tests.quantization.gguf_writer import hf_gguf_greedy, write_tiny_gguf
from tests.quantization.quant_test_utils import generate, runner_attr
from tests.utils import make_tiny_model
from vllm import LLM
from vllm.model_executor.layers.quantization.utils.gguf_quants import (
    GGML_BLOCK_SIZES,
    GGML_QUANT_TYPES,
    decode_gguf_rows,
)

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 10, 11, 12, 13, 14
IQ4_NL = 20  # a ggml type not built here
SHAPES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
# K-quants need 256-element rows.
K_SHAPES = dict(SHAPES, hidden_size=256, intermediate_size=512)
# file -> (shapes, per-kind types, default type, tied head)
FILES = {
    "q4_0": (SHAPES, {}, Q4_0, False),
    "q8_0-tied": (SHAPES, {}, Q8_0, True),
    # As a Q4_K_M file: q / k Q4_K but v Q6_K (one fused qkv_proj of two types),
    # gate Q2_K / up Q5_K (gate_up_proj), down Q6_K, o Q3_K, tied Q6_K table.
    "k-mix-tied": (
        K_SHAPES,
        {
            "attn_v": Q6_K,
            "ffn_down": Q6_K,
            "token_embd": Q6_K,
            "ffn_up": Q5_K,
            "attn_output": Q3_K,
            "ffn_gate": Q2_K,
        },
        Q4_K,
        True,
    ),
}


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """file name -> (.gguf path, transformers' greedy tokens on its weights)."""
    out = {}
    for name, (shapes, types, default, tie) in FILES.items():
        src = make_tiny_model("llama", str(tmp_path_factory.mktemp(f"{name}-src")), **shapes)
        path = write_tiny_gguf(
            src, str(tmp_path_factory.mktemp(name) / "m.gguf"), types, default, tie
        )
        out[name] = (path, hf_gguf_greedy(path, src, _prompts(), MAX_TOKENS))
    return out


def _random_blocks(qtype: int, rows: int, cols: int, rng) -> np.ndarray:
    """Random blocks of a K-quant with finite f16 scales (gguf-py cannot quantize them)."""
    from tests.quantization.gguf_writer import _random_k_blocks

    return _random_k_blocks(rng.standard_normal((rows, cols)).astype(np.float32), qtype, rng)


@pytest.mark.parametrize("qtype", GGML_QUANT_TYPES)
def test_decode_equals_gguf_dequantize_bit_for_bit(qtype):
    import gguf

    rng = np.random.default_rng(qtype)
    rows, cols = 6, 512
    if qtype in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    else:
        raw = _random_blocks(qtype, rows, cols, rng)
    assert raw.shape == (rows, cols // GGML_BLOCK_SIZES[qtype][0] * GGML_BLOCK_SIZES[qtype][1])
    ref = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)), np.float32)
    decoded = decode_gguf_rows(torch.from_numpy(raw), qtype, cols)
    assert decoded.q.dtype == torch.int8 and decoded.scale.dtype == torch.float32
    ours = decoded.dequantize().numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q4_K])
@pytest.mark.parametrize("mixed", [False, True])
def test_int4_kernel_form_computes_the_decoded_weight(qtype, mixed):
    """The int4 kernel's (u, scale, zero) of 4-bit rows (one type, or Q4_0 rows
    and `qtype` rows in one layer) multiply as the decoded float32 weight."""
    import gguf

    from vllm.model_executor.layers.quantization.gguf import to_int4
    from vllm.model_executor.layers.quantization.utils.int4_cpu import int4_cpu_linear

    rng = np.random.default_rng(qtype)
    rows, cols = 64, 512
    types = [Q4_0, qtype] if mixed else [qtype, qtype]
    parts, dense = [], torch.empty(rows, cols)
    for i, t in enumerate(types):
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[i * rows // 2 : (i + 1) * rows // 2] = True
        if t == Q4_K:
            raw = _random_blocks(t, rows // 2, cols, rng)
        else:
            w = rng.standard_normal((rows // 2, cols)).astype(np.float32)
            raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(t))
        decoded = decode_gguf_rows(torch.from_numpy(raw), t, cols)
        parts.append((mask, decoded))
        dense[mask] = decoded.dequantize()
    packed, scale_and_zero = to_int4(parts, rows, cols, torch.float32)
    x = torch.randn(3, cols)
    out = int4_cpu_linear(x, packed, scale_and_zero, 32)
    torch.testing.assert_close(out, x @ dense.t(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("runner", ["0", "1"])
@pytest.mark.parametrize("name", list(FILES))
def test_greedy_matches_transformers(gguf_files, monkeypatch, name, runner):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    path, expected = gguf_files[name]
    llm = LLM(model=path, dtype="float32", max_model_len=128, seed=0)
    assert llm.llm_engine.vllm_config.model_config.quantization == "gguf"
    assert llm.llm_engine.vllm_config.use_v2_model_runner is (runner == "1")
    # Kept quantized: a float32 model holds every type as int8 values (the
    # int4 kernel is slow with float32 activations; bf16: see the bytes test).
    (kinds,) = runner_attr(
        llm,
        lambda r: [
            (m.qweight.dtype, type(m.quant_method).__name__)
            for m in (r.get_model().model.layers[0].mlp.down_proj, r.get_model().model.embed_tokens)
        ],
    )
    assert kinds == [(torch.int8, "GGUFLinearMethod"), (torch.int8, "GGUFEmbeddingMethod")]
    assert generate(llm) == expected


@pytest.mark.parametrize("name", ["q4_0", "q8_0-tied"])
def test_tp2_greedy_matches_transformers(gguf_files, name):
    """Column-parallel layers split the block rows, row-parallel ones whole
    blocks along the input; the vocabulary rows of the table split too."""
    path, expected = gguf_files[name]
    llm = LLM(model=path, dtype="float32", max_model_len=128, seed=0, tensor_parallel_size=2)
    assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    assert generate(llm) == expected


def test_q4_weight_bytes_at_most_035_of_bf16(tmp_path, monkeypatch):
    """Linears dominate this model, so the whole model's bytes show the ratio.
    Measured 0.334x (2,822,656 / 8,458,752 bytes): int4 linears with bf16
    scale / zero pairs, and the Q4_0 token and output tables decoded to int8
    + fp32 group scales (the .gguf file itself is 0.281x)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    shapes = dict(SHAPES, hidden_size=256, intermediate_size=1024, num_hidden_layers=4)
    src = make_tiny_model("llama", str(tmp_path / "src"), **shapes)
    path = write_tiny_gguf(src, str(tmp_path / "q4.gguf"), {}, Q4_0)
    sizes = {}
    for key, model in (("bf16", src), ("q4_0", path)):
        llm = LLM(model=model, dtype="bfloat16", max_model_len=64, seed=0)
        (sizes[key],) = runner_attr(llm, lambda r: r.model_memory_usage)
        if key == "q4_0":  # bf16: the Q4_0 linears are int4, packed two per byte
            (dtype,) = runner_attr(
                llm, lambda r: r.get_model().model.layers[0].mlp.down_proj.qweight.dtype
            )
            assert dtype == torch.uint8
        del llm
    ratio = sizes["q4_0"] / sizes["bf16"]
    assert ratio <= 0.35, (sizes, ratio)


def test_truncated_file_is_refused_naming_it(gguf_files, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    with open(gguf_files["q4_0"][0], "rb") as f:
        data = f.read()
    for cut, what in ((len(data) - 100, "past the end of the file"), (200, "unreadable")):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"{bad}.*truncated or corrupt.*{what}"):
            EngineArgs(model=str(bad)).create_engine_config()


def test_unbuilt_type_is_refused_naming_tensor_and_type(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model("llama", str(tmp_path / "src"), **SHAPES)
    path = write_tiny_gguf(src, str(tmp_path / "iq.gguf"), {"ffn_up": IQ4_NL}, Q4_0)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight has GGUF type IQ4_NL.*not built"):
        LLM(model=path, dtype="float32", max_model_len=64, seed=0)
