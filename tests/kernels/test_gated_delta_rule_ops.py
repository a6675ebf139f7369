"""The chunked (WY) and batched recurrent gated delta rule against the
token-by-token reference: padded batches of different lengths (incl. 1 and
non-multiples of the chunk), carried initial states, a sequence split across
calls continuing from the cached state, and bfloat16 inputs with float32 states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers.fla.ops import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    recurrent_gated_delta_rule_ref,
)

H, DK, DV = 3, 8, 6


def _seq(length: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(
        q=r(length, H, DK),
        k=F.normalize(r(length, H, DK), dim=-1),
        v=r(length, H, DV),
        g=-F.softplus(r(length, H)) * 2,
        beta=torch.rand(length, H, generator=gen),
    )


def _pad(seqs: list[dict[str, torch.Tensor]], max_len: int) -> dict[str, torch.Tensor]:
    """[G, max_len, ...]; random padding except g = beta = 0 there."""
    out = {}
    for name in seqs[0]:
        rows = []
        for s in seqs:
            pad = torch.randn(max_len - s[name].shape[0], *s[name].shape[1:])
            if name in ("g", "beta"):
                pad.zero_()
            rows.append(torch.cat((s[name], pad)))
        out[name] = torch.stack(rows)
    return out


@pytest.mark.parametrize(
    "rule,chunk_size",
    [
        (chunk_gated_delta_rule, 16),
        (chunk_gated_delta_rule, 64),
        (fused_recurrent_gated_delta_rule, None),
    ],
)
def test_batched_rules_match_reference_on_a_padded_batch(rule, chunk_size):
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 5, 16, 17, 64, 65, 100]
    seqs = [_seq(n, gen) for n in lengths]
    s0 = torch.randn(len(lengths), H, DK, DV, generator=gen)
    p = _pad(seqs, max(lengths))
    kwargs = {} if chunk_size is None else dict(chunk_size=chunk_size)
    o, state = rule(p["q"], p["k"], p["v"], p["g"], p["beta"], s0, **kwargs)
    assert state.dtype == torch.float32 and o.shape == p["v"].shape
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        o_ref, s_ref = recurrent_gated_delta_rule_ref(
            s["q"], s["k"], s["v"], s["g"], s["beta"], s0[i]
        )
        torch.testing.assert_close(o[i, :n], o_ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(state[i], s_ref, atol=2e-5, rtol=2e-5)


def test_chunked_prefill_continues_from_cached_state():
    """90 tokens as prefills of 20 and 63 (continuing from the state), then 7
    batched decode steps == one reference pass from zeros; explicit scale."""
    gen = torch.Generator().manual_seed(1)
    s = _seq(90, gen)
    o_ref, s_ref = recurrent_gated_delta_rule_ref(
        s["q"], s["k"], s["v"], s["g"], s["beta"], scale=0.5
    )
    state, outs = None, []
    for lo, hi in ((0, 20), (20, 83)):
        part = {k: v[None, lo:hi] for k, v in s.items()}
        o, state = chunk_gated_delta_rule(
            part["q"],
            part["k"],
            part["v"],
            part["g"],
            part["beta"],
            state,
            scale=0.5,
            chunk_size=32,
        )
        outs.append(o[0])
    for t in range(83, 90):
        step = {k: v[None, t : t + 1] for k, v in s.items()}
        o, state = fused_recurrent_gated_delta_rule(
            step["q"], step["k"], step["v"], step["g"], step["beta"], state, scale=0.5
        )
        outs.append(o[0])
    torch.testing.assert_close(torch.cat(outs), o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(state[0], s_ref, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_gated_delta_rule(
            s["q"][None], s["k"][None], s["v"][None], s["g"][None], s["beta"][None], chunk_size=0
        )


def test_bfloat16_inputs_accumulate_in_float32():
    gen = torch.Generator().manual_seed(2)
    s = {k: v.to(torch.bfloat16) for k, v in _seq(40, gen).items()}
    o, state = chunk_gated_delta_rule(*(s[k][None] for k in ("q", "k", "v", "g", "beta")))
    o_ref, s_ref = recurrent_gated_delta_rule_ref(s["q"], s["k"], s["v"], s["g"], s["beta"])
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    torch.testing.assert_close(state[0], s_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(o[0].float(), o_ref.float(), atol=2e-2, rtol=2e-2)
