"""The LoRA layers under tensor parallelism: two ranks over gloo (two
spawned processes), each rank's output against the TP=1 output's part that
rank holds. Column layers split B per slice (the one-KV-head qkv keeps k / v
whole on both ranks), row layers split A and add their partial delta before
the all-reduce; the fully sharded (S-LoRA) variants also split the rank; the
embedding and LM head keep A and B whole and add after the base layer's
reduce / gather. Same adapters and mapping as tests/lora/test_layers.py."""

from __future__ import annotations

import torch

from tests.distributed.utils import init_gloo_rank, run_gloo_world
from tests.lora.test_layers import (
    CASES,
    EXPECTED_CLASS,
    EXPECTED_SHARDED_CLASS,
    TOKEN_IDS,
    Case,
    _wrapped,
    _x,
)
from tests.lora.test_layers_vocab import DIM, SAMPLED_IDS, _ids, embedding_with_lora, head_with_lora

TP_CASES = ["column", "gate_up", "gate_up_single", "qkv", "qkv_single", "row"]


def _rank_columns(case: Case, rank: int, full: torch.Tensor) -> torch.Tensor:
    """The columns of the TP=1 output that `rank` of 2 holds: each slice
    split in halves (the k / v slices of a one-KV-head qkv are replicated);
    a row layer's output is whole on every rank."""
    if case.kind == "row":
        return full
    if case.kind == "qkv1":  # q (64) split, k / v (16 each) on both ranks
        return torch.cat([full[:, rank * 32 : (rank + 1) * 32], full[:, 64:]], dim=1)
    sizes = (48, 48) if case.kind == "merged" else case.slices
    parts, off = [], 0
    for size in sizes:
        half = size // 2
        parts.append(full[:, off + rank * half : off + (rank + 1) * half])
        off += size
    return torch.cat(parts, dim=1)


def _outputs(rank: int) -> dict:
    """Every layer's output on this rank (rank 0 of 1 for TP=1)."""
    results = {}
    for name in TP_CASES:
        case = CASES[name]
        for sharded in (False, True):
            layer, _ = _wrapped(case, torch.float32, prefill=True, fully_sharded=sharded)
            x = _x(case, torch.float32)
            if case.kind == "row" and layer.tp_size > 1:  # input_is_parallel
                x = x.chunk(2, dim=-1)[rank].contiguous()
            results[(name, sharded)] = (type(layer).__name__, layer(x)[0])
    embedding = embedding_with_lora(torch.float32, prefill=False)
    results["embedding"] = ("", embedding(_ids()))
    hidden = torch.randn(len(TOKEN_IDS), DIM, generator=torch.Generator().manual_seed(9))
    for sampled in (tuple(TOKEN_IDS), SAMPLED_IDS):
        head_layer, head = head_with_lora(torch.float32, sampled)
        results[("logits", len(sampled))] = ("", head_layer(head, hidden[: len(sampled)]))
    return results


def _tp_rank_main(rank: int, init_method: str, out) -> None:
    from vllm import distributed as d

    init_gloo_rank(2, rank, init_method, tp=2)
    results = {k: (cls, t.tolist()) for k, (cls, t) in _outputs(rank).items()}
    out.put((rank, results))
    d.destroy_distributed_environment()


def test_tp2_equals_tp1():
    results = run_gloo_world(_tp_rank_main, 2, timeout=240)
    tp1 = _outputs(0)
    for key, (_, full) in tp1.items():
        for rank in (0, 1):
            cls_name, got = results[rank][key]
            if isinstance(key, tuple) and key[0] in CASES:
                name, sharded = key
                assert (
                    cls_name
                    == (EXPECTED_SHARDED_CLASS if sharded else EXPECTED_CLASS)[name].__name__
                )
                full_part = _rank_columns(CASES[name], rank, full)
            else:  # embedding / logits: whole on every rank
                full_part = full
            torch.testing.assert_close(torch.tensor(got), full_part, atol=1e-5, rtol=0)
