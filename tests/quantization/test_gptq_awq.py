"""GPTQ (v1 / v2 zeros, desc_act false and true) and AWQ (GEMM) 4-bit
checkpoints, written here in their own layouts (gptq_awq_utils.py), kept int4
in memory (torch's CPU int4 kernel) and producing transformers' greedy tokens
on the dequantized weights under both model runners and at TP=2; their
weights take <= 0.35x the bf16 model's bytes; unbuilt settings and broken
checkpoints are refused at start-up by name."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.models.test_greedy_parity import MAX_TOKENS, _prompts
from tests.quantization.gptq_awq_utils import (
    _g_idx,
    awq_config,
    gptq_config,
    pack_awq,
    pack_gptq,
    rtn_int4,
    write_quantized,
)
from tests.quantization.quant_test_utils import (
    assert_truncated_refused,
    expected,
    generate,
    runner_attr,
    tp2_llm,
    weight_bytes,
)
from tests.utils import hf_greedy, make_tiny_model
from vllm import LLM
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.linear import MergedColumnParallelLinear
from vllm.model_executor.layers.quantization.awq import AWQConfig
from vllm.model_executor.layers.quantization.gptq import GPTQConfig
from vllm.model_executor.layers.quantization.utils.gptq_utils import regroup_by_g_idx
from vllm.model_executor.layers.quantization.utils.int4_cpu import int4_cpu_linear, pack_int4_cpu

# Groups of 128 over K = 256 (hidden) and 512 (intermediate): at TP=2 each
# row-parallel rank still holds whole groups (o_proj 128, down_proj 256 inputs).
SHAPES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
# name -> write_quantized kwargs
CHECKPOINTS = {
    "gptq": dict(method="gptq"),
    "gptq-actorder-asym": dict(method="gptq", desc_act=True, sym=False),
    "gptq-v2-asym": dict(method="gptq", sym=False, fmt="gptq_v2"),
    "awq": dict(method="awq"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (quantized dir, dequantized reference dir), one tiny Llama."""
    src = make_tiny_model("llama", str(tmp_path_factory.mktemp("src")), **SHAPES)
    out = {}
    for name, kwargs in CHECKPOINTS.items():
        dst, ref = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(f"{name}-ref")
        write_quantized(src, str(dst), str(ref), **kwargs)
        out[name] = (str(dst), str(ref))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_fused_layer_equals_the_dequantized_product(name, dtype):
    """A gate_up-style fused layer loaded shard by shard from checkpoint
    tensors computes x @ dequantized.T to float32 rounding (bfloat16: to
    bfloat16 rounding). float32 layers store int8 values for the int8 group
    GEMM, bfloat16 ones int4 pairs for torch's int4 kernel (utils/int4_cpu.py)."""
    kw = CHECKPOINTS[name]
    method, desc_act, sym = kw["method"], kw.get("desc_act", False), kw.get("sym", True)
    fmt = kw.get("fmt", "gptq")
    cfg = (
        GPTQConfig.from_config(gptq_config(128, desc_act, sym, fmt))
        if method == "gptq"
        else AWQConfig.from_config(awq_config(128))
    )
    layer = MergedColumnParallelLinear(
        256, [64, 128], bias=False, quant_config=cfg, params_dtype=dtype, prefix="m.gate_up"
    )
    gen = torch.Generator().manual_seed(0)
    g_idx = _g_idx(256, 128, desc_act, gen)  # the fused shards share their input's order
    dense = []
    for shard, n in enumerate((64, 128)):
        q, zero, scale = rtn_int4(torch.randn(n, 256, generator=gen), g_idx, 2, sym)
        if method == "gptq":
            qweight, qzeros = pack_gptq(q, zero, v2=fmt == "gptq_v2")
            tensors = {"g_idx": g_idx.to(torch.int32)}
        else:
            qweight, qzeros, tensors = *pack_awq(q, zero), {}
        tensors.update(qweight=qweight, qzeros=qzeros, scales=scale.to(dtype))
        for param_name, tensor in tensors.items():
            param = getattr(layer, param_name)
            param.weight_loader(param, tensor, shard)
        dense.append((q - zero.t()[:, g_idx]) * scale.to(dtype).t()[:, g_idx].double())
    layer.process_weights_after_loading(dtype)
    # float32: int8 [N, K]; bfloat16: two int4 values per byte
    assert layer.qweight.dtype == (torch.int8 if dtype == torch.float32 else torch.uint8)
    if dtype == torch.float32:  # symmetric: every zero is 0, no offsets kept
        assert layer.scales.shape == (1 if sym else 2, 192, 2)
    assert hasattr(layer, "g_idx_sort_indices") is desc_act
    x = torch.randn(5, 256, generator=gen).to(dtype)
    y, _ = layer(x)
    assert y.dtype == dtype
    want = x.double() @ torch.cat(dense).double().t()
    tol = 2e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double(), want, rtol=0, atol=tol * float(want.abs().max()))


def test_actorder_rank_with_partial_groups_pads_them():
    """A row-parallel rank's slice of an act-order layer holds part of each
    group: each is padded to group_size inputs (zero activations), and the
    product over the slice is exact."""
    gen = torch.Generator().manual_seed(1)
    g_idx = _g_idx(512, 128, True, gen)
    q, zero, scale = rtn_int4(torch.randn(64, 512, generator=gen), g_idx, 4, False)
    cols = torch.arange(256, 512)  # rank 1 of 2
    u, gi = q[:, cols].to(torch.int32), g_idx[cols]
    zpair = (8 - zero).float() * scale
    index, u2, s2, z2 = regroup_by_g_idx(u, gi, scale, zpair, 128, "m.down_proj")
    assert index.numel() % 128 == 0 and int(index.max()) == 256  # padded
    packed, sz = pack_int4_cpu(u2, s2.t(), z2.t())
    x = torch.randn(3, 256, generator=gen)
    y = int4_cpu_linear(
        torch.cat([x, torch.zeros(3, 1)], 1).index_select(1, index), packed, sz, 128
    )
    dense = (q - zero.t()[:, g_idx]) * scale.t()[:, g_idx]
    want = x.double() @ dense[:, cols].double().t()
    torch.testing.assert_close(y.double(), want, rtol=0, atol=2e-4 * float(want.abs().max()))


@pytest.mark.parametrize("runner", ["0", "1"])
@pytest.mark.parametrize("name", ["gptq", "gptq-actorder-asym", "awq"])
def test_greedy_matches_transformers_on_dequantized_weights(checkpoints, monkeypatch, name, runner):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    model_dir, ref_dir = checkpoints[name]
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, seed=0)
    method = CHECKPOINTS[name]["method"]
    assert llm.llm_engine.vllm_config.model_config.quantization == method
    assert llm.llm_engine.vllm_config.use_v2_model_runner is (runner == "1")
    (dtype,) = runner_attr(llm, lambda r: r.get_model().model.layers[0].mlp.down_proj.qweight.dtype)
    assert dtype == torch.int8  # a float32 model's 4-bit values, one per byte
    assert generate(llm) == expected(ref_dir)


def test_gptq_v2_zeros(checkpoints, monkeypatch):
    """checkpoint_format gptq_v2 stores the zero itself (v1: zero - 1)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir, ref_dir = checkpoints["gptq-v2-asym"]
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, seed=0)
    assert generate(llm) == expected(ref_dir)


@pytest.mark.parametrize("name", ["gptq-actorder-asym", "awq"])
def test_tp2_greedy_matches_transformers(checkpoints, name):
    """Row-parallel layers split the [in, out]-major tensors along dim 0
    (act-order: each rank keeps every group's scales and pads the groups it
    holds part of), column-parallel ones along dim 1 (AWQ's packed outputs)."""
    model_dir, ref_dir = checkpoints[name]
    llm = tp2_llm(model_dir)
    assert generate(llm) == expected(ref_dir)


def test_weight_bytes_at_load(tmp_path, monkeypatch):
    """Linears dominate this model: half a byte per weight plus a bf16
    (scale, zero) pair per group of 128 and output (qzeros and g_idx are
    folded away at load); the rest (embeddings, LM head, norms) unchanged."""
    shapes = dict(SHAPES, intermediate_size=1024, num_hidden_layers=4)
    src = make_tiny_model("llama", str(tmp_path / "src"), **shapes)
    bf16 = weight_bytes(src, monkeypatch)
    h, i, layers, kv = 256, 1024, 4, 128
    linear_params = layers * (h * (h + 2 * kv) + h * h + 2 * h * i + i * h)
    w4 = bf16 - 2 * linear_params + linear_params // 2 + 4 * linear_params // 128
    for method in ("gptq", "awq"):
        dst = str(tmp_path / method)
        write_quantized(src, dst, None, method, desc_act=method == "gptq")
        ratio = weight_bytes(dst, monkeypatch) / bf16
        # act-order: an int64 input index per layer (qkv, o, gate_up: h; down: i)
        extra = 8 * layers * (3 * h + i) if method == "gptq" else 0
        assert ratio == pytest.approx((w4 + extra) / bf16, rel=1e-3), method
        assert ratio <= 0.35, (method, ratio)


def _config(model: str, **kwargs):
    return EngineArgs(model=model, **kwargs).create_engine_config()


def _with(model_dir: str, dst: str, **changes) -> str:
    """A copy of `model_dir` whose quantization_config has `changes`."""
    import shutil

    shutil.copytree(model_dir, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"].update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return dst


REFUSED = {
    "gptq-bits3": ("gptq", dict(bits=3), r"GPTQ bits=3 is not built"),
    "gptq-bits8": ("gptq", dict(bits=8), r"GPTQ bits=8 is not built"),
    "gptq-channelwise": ("gptq", dict(group_size=-1), r"GPTQ group_size=-1 is not built"),
    "gptq-lm-head": ("gptq", dict(lm_head=True), r"GPTQ lm_head=true"),
    "gptq-dynamic": ("gptq", dict(dynamic={r"-:.*mlp.*": {}}), r"GPTQ dynamic"),
    "gptq-marlin-format": ("gptq", dict(checkpoint_format="marlin"), r"checkpoint_format='marlin'"),
    "awq-bits3": ("awq", dict(bits=3), r"AWQ w_bit / bits=3 is not built"),
    "awq-gemv": ("awq", dict(version="gemv"), r"AWQ version='gemv'"),
    "awq-no-zero-point": ("awq", dict(zero_point=False), r"AWQ zero_point=false"),
    "awq-group16": ("awq", dict(group_size=16), r"group_size=16 is not built"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unbuilt_settings_are_refused_at_start_up(checkpoints, tmp_path, case):
    name, changes, message = REFUSED[case]
    model = _with(checkpoints[name][0], str(tmp_path / case), **changes)
    with pytest.raises(ValueError, match=message):
        _config(model)


def test_quantization_argument(checkpoints):
    """-q gptq / awq are accepted for their checkpoints; the Marlin names
    (CUDA kernels) are refused naming the method that runs; a contradicting
    method is refused."""
    gptq, awq = checkpoints["gptq"][0], checkpoints["awq"][0]
    assert isinstance(_config(gptq, quantization="gptq").quant_config, GPTQConfig)
    assert isinstance(_config(awq, quantization="awq").quant_config, AWQConfig)
    with pytest.raises(ValueError, match=r"'gptq_marlin' needs the Marlin CUDA.*-q gptq"):
        _config(gptq, quantization="gptq_marlin")
    with pytest.raises(ValueError, match=r"'awq_marlin' needs the Marlin CUDA.*-q awq"):
        _config(awq, quantization="awq_marlin")
    with pytest.raises(ValueError, match=r"model config \(gptq\) does not match.*awq"):
        _config(gptq, quantization="awq")


def _edit_tensors(model_dir: str, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = f"{model_dir}/model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_bad_checkpoints_are_refused_naming_the_tensor_or_file(checkpoints, tmp_path, monkeypatch):
    """A qweight of the wrong shape or kind, an act-order g_idx under
    desc_act=false, a truncated file: a clear error at load naming it."""
    import shutil

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    name = "model.layers.1.mlp.down_proj.qweight"

    def shrink(t):
        t[name] = t[name][:-1].contiguous()

    def as_float(t):
        t[name] = t[name].float()

    cases = {
        "shape": ("gptq", shrink, rf"tensor '{name}'.*shape \(63, 256\) does not hold 64"),
        "dtype": ("awq", as_float, rf"tensor '{name}'.*torch.float32 tensor into a torch.int32"),
    }
    for case, (ckpt, edit, message) in cases.items():
        dst = str(tmp_path / case)
        shutil.copytree(checkpoints[ckpt][0], dst)
        _edit_tensors(dst, edit)
        with pytest.raises(ValueError, match=message):
            LLM(model=dst, dtype="float32", max_model_len=128)
    wrong = _with(checkpoints["gptq-actorder-asym"][0], str(tmp_path / "order"), desc_act=False)
    with pytest.raises(ValueError, match=r"qkv_proj: g_idx is not k // group_size"):
        LLM(model=wrong, dtype="float32", max_model_len=128)
    dst = str(tmp_path / "truncated")
    shutil.copytree(checkpoints["awq"][0], dst)
    assert_truncated_refused(dst)


def _move_config_to_side_file(model_dir: str, dst: str, side: str, config: dict) -> str:
    """A copy of `model_dir` whose config.json has no quantization_config and
    whose `side` file holds `config` (how AutoGPTQ / AutoAWQ saved them)."""
    import shutil

    shutil.copytree(model_dir, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    del cfg["quantization_config"]
    with open(path, "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(dst, side), "w") as f:
        json.dump(config, f)
    return dst


def test_side_file_configs_with_q(checkpoints, tmp_path, monkeypatch):
    """A checkpoint whose config lives in AutoGPTQ's quantize_config.json or
    AutoAWQ's quant_config.json (no quant_method in them) runs with -q naming
    the method, as upstream reads those files for it."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    gptq_cfg = {k: v for k, v in gptq_config(128, False, True).items() if k != "quant_method"}
    gptq = _move_config_to_side_file(
        checkpoints["gptq"][0], str(tmp_path / "gptq"), "quantize_config.json", gptq_cfg
    )
    config = _config(gptq, quantization="gptq")
    assert isinstance(config.quant_config, GPTQConfig) and config.quant_config.group_size == 128
    assert _config(gptq).model_config.quantization is None  # not read without -q, as upstream
    autoawq = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}
    model_dir, ref_dir = checkpoints["awq"]
    awq = _move_config_to_side_file(model_dir, str(tmp_path / "awq"), "quant_config.json", autoawq)
    llm = LLM(model=awq, quantization="awq", dtype="float32", max_model_len=128, seed=0)
    assert generate(llm) == expected(ref_dir)


def test_qwen2_biased_qkv(tmp_path, monkeypatch):
    """Qwen2 (the most common GPTQ / AWQ family): q / k / v biases are added
    after the int4 GEMM (act-order asymmetric GPTQ; AWQ shares the path)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    src = make_tiny_model("qwen2", str(tmp_path / "src"), **SHAPES)
    dst, ref = str(tmp_path / "dst"), str(tmp_path / "ref")
    write_quantized(src, dst, ref, "gptq", desc_act=True, sym=False)
    llm = LLM(model=dst, dtype="float32", max_model_len=128, seed=0)
    (has_bias,) = runner_attr(
        llm, lambda r: r.get_model().model.layers[0].self_attn.qkv_proj.bias is not None
    )
    assert has_bias
    assert generate(llm) == hf_greedy(ref, _prompts(), MAX_TOKENS)


def test_module_lists_pick_the_quantized_layers():
    """GPTQ's modules_in_block_to_quantize (only those) and AWQ's
    modules_to_not_convert (all but those) match module-name substrings; the
    parts of a fused layer must agree."""
    from vllm.model_executor.layers.linear import ReplicatedLinear

    def kind(cfg, prefix, fused=False):
        cfg.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}
        if fused:
            layer = MergedColumnParallelLinear(256, [128, 128], quant_config=cfg, prefix=prefix)
        else:
            layer = ReplicatedLinear(256, 128, quant_config=cfg, prefix=prefix)
        return type(layer.quant_method).__name__

    gptq = GPTQConfig.from_config(
        dict(gptq_config(128, False, True), modules_in_block_to_quantize=[["mlp.down_proj"]])
    )
    assert kind(gptq, "model.layers.0.mlp.down_proj") == "GPTQLinearMethod"
    assert kind(gptq, "model.layers.0.self_attn.o_proj") == "UnquantizedLinearMethod"
    awq = AWQConfig.from_config(dict(awq_config(128), modules_to_not_convert=["o_proj"]))
    assert kind(awq, "model.layers.0.self_attn.o_proj") == "UnquantizedLinearMethod"
    assert kind(awq, "model.layers.0.mlp.gate_up_proj", fused=True) == "AWQLinearMethod"
    mixed = AWQConfig.from_config(dict(awq_config(128), modules_to_not_convert=["up_proj"]))
    with pytest.raises(ValueError, match="fused layer 'model.layers.0.mlp.gate_up_proj'"):
        kind(mixed, "model.layers.0.mlp.gate_up_proj", fused=True)
