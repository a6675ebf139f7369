"""The counting of benchmarks/roofline_floors.py: shapes and parameters against a real
transformers model, and the floors against hand-worked figures."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from roofline_floors import Workload, floors, gemm_seconds, model_shape  # noqa: E402


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    path = str(tmp_path_factory.mktemp("qwen2-roofline"))
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def test_shape_and_params_match_the_checkpoint(qwen2_dir):
    from transformers import AutoModelForCausalLM

    shape = model_shape(qwen2_dir)
    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(qwen2_dir).parameters())
    assert shape.params == real
    names = {lin.name: (lin.k, lin.n, lin.count) for lin in shape.linears}
    assert names["qkv_proj"] == (64, (4 + 2 * 2) * 16, 3)
    assert names["gate_up_proj"] == (64, 192, 3) and names["down_proj"] == (96, 64, 3)
    assert names["lm_head"] == (64, 320, 1)
    assert shape.kv_elems_per_token() == 2 * 3 * 2 * 16


def test_floors_by_hand(qwen2_dir):
    shape = model_shape(qwen2_dir)
    wl = Workload(num_prompts=2, input_len=4, output_len=3, budget=4)  # 2 prefill passes
    t = 1e-3  # every linear call takes 1 ms at both phases
    gemm = {ph: {lin.name: {"best_s": t} for lin in shape.linears} for ph in ("prefill", "decode")}
    fl = floors(shape, wl, gemm, bw_Bps=1e9, esize=2)
    assert fl.passes == 2 + 2
    body = sum(lin.k * lin.n * lin.count for lin in shape.linears[:-1])
    lm = 64 * 320
    pair = 4 * 4 * 16 * 3  # 4 x heads x head_dim x layers
    prefill_flops = 2 * body * 8 + 2 * lm * 2 + pair * 2 * (4 * 5 / 2)
    decode_flops = sum(2 * body * 2 + 2 * lm * 2 + pair * 2 * (4 + s) for s in (1, 2))
    assert fl.per_phase["prefill"]["flops"] == pytest.approx(prefill_flops)
    assert fl.per_phase["decode"]["flops"] == pytest.approx(decode_flops)
    # Decode compute: 13 linear calls (4 per layer x 3 + the LM head) per pass + attention.
    n_calls = 4 * 3 + 1
    assert fl.per_phase["decode"]["compute_s"] > 2 * n_calls * t
    weights = (shape.params - shape.embed_params) * 2
    assert fl.memory_s > 4 * weights / 1e9
    # The roofline sums each pass's max: between the larger sum and the two sums together.
    assert max(fl.compute_s, fl.memory_s) <= fl.roofline_s <= fl.compute_s + fl.memory_s
    assert fl.binding == "prefill compute, decode compute"


def test_gemm_seconds_reports_every_variant():
    t = gemm_seconds(8, 32, 16, torch.float32, reps=2)
    assert {"dense_t1", "best_s"} <= set(t) and all(v > 0 and math.isfinite(v) for v in t.values())
    assert t["best_s"] <= min(t.values())
