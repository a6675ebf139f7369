"""The batched Mamba-1 ops against the token-by-token reference
(`selective_scan_ref`) and a per-sequence conv: padded batches of different
lengths, carried initial states, and a sequence split across calls (chunked
prefill continuing from the cached state) equal to one call over the whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
    causal_conv1d_fn,
    causal_conv1d_update,
)
from vllm.model_executor.layers.mamba.ops.mamba_ssm import (
    selective_scan_fn,
    selective_scan_ref,
    selective_state_update,
)
from vllm.model_executor.layers.mamba.ops.varlen import build_state_groups

D, N, K = 12, 4, 4


def _seq(length: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(
        u=r(length, D), dt=F.softplus(r(length, D)), b=r(length, N), c=r(length, N), z=r(length, D)
    )


def _params(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    # A spread over [-e^2, -e^-2]: some channels forget within a few tokens.
    a = -torch.exp(4 * torch.rand(D, N, generator=gen) - 2)
    return a, torch.randn(D, generator=gen)


def _pad(seqs: list[dict[str, torch.Tensor]], max_len: int) -> dict[str, torch.Tensor]:
    """Stack per-sequence tensors into [G, max_len, ...]; padding is random
    (it must not matter) except dt = 0 there."""
    out = {}
    for name in seqs[0]:
        rows = []
        for s in seqs:
            pad = torch.randn(max_len - s[name].shape[0], *s[name].shape[1:])
            if name == "dt":
                pad.zero_()
            rows.append(torch.cat((s[name], pad)))
        out[name] = torch.stack(rows)
    return out


@pytest.mark.parametrize("chunk_size", [8, 32])
def test_scan_matches_reference_on_a_padded_batch(chunk_size):
    gen = torch.Generator().manual_seed(0)
    a, d = _params(gen)
    lengths = [1, 7, 8, 9, 32, 33, 77]  # 1, within / at / past chunk boundaries
    seqs = [_seq(n, gen) for n in lengths]
    h0 = torch.randn(len(lengths), D, N, generator=gen)
    p = _pad(seqs, max(lengths))
    y, h = selective_scan_fn(
        p["u"], p["dt"], a, p["b"], p["c"], d, p["z"], h0, chunk_size=chunk_size
    )
    assert h.dtype == torch.float32 and y.shape == p["u"].shape
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        y_ref, h_ref = selective_scan_ref(s["u"], s["dt"], a, s["b"], s["c"], d, s["z"], h0[i])
        torch.testing.assert_close(y[i, :n], y_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(h[i], h_ref, atol=1e-5, rtol=1e-5)
    # Without an initial state the scan starts from zeros.
    y0, _ = selective_scan_fn(p["u"][:1], p["dt"][:1], a, p["b"][:1], p["c"][:1], d, p["z"][:1])
    y0_ref, _ = selective_scan_ref(
        seqs[0]["u"], seqs[0]["dt"], a, seqs[0]["b"], seqs[0]["c"], d, seqs[0]["z"]
    )
    torch.testing.assert_close(y0[0, :1], y0_ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan_fn(p["u"], p["dt"], a, p["b"], p["c"], chunk_size=0)


def test_scan_continues_from_cached_state_and_decode_steps():
    """50 tokens as a 13-token prefill, a 30-token prefill continuing from
    its state, then 7 batched one-token steps == one reference pass."""
    gen = torch.Generator().manual_seed(1)
    a, d = _params(gen)
    s = _seq(50, gen)
    y_ref, h_ref = selective_scan_ref(s["u"], s["dt"], a, s["b"], s["c"], d, s["z"])
    h = None
    ys = []
    for lo, hi in ((0, 13), (13, 43)):
        part = {k: v[None, lo:hi] for k, v in s.items()}
        y, h = selective_scan_fn(part["u"], part["dt"], a, part["b"], part["c"], d, part["z"], h)
        ys.append(y[0])
    for t in range(43, 50):
        y, h = selective_state_update(
            h,
            s["u"][None, t],
            s["dt"][None, t],
            a,
            s["b"][None, t],
            s["c"][None, t],
            d,
            s["z"][None, t],
        )
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h[0], h_ref, atol=1e-5, rtol=1e-5)


def test_state_update_is_batched_over_sequences():
    gen = torch.Generator().manual_seed(2)
    a, d = _params(gen)
    seqs = [_seq(1, gen) for _ in range(5)]
    h0 = torch.randn(5, D, N, generator=gen)
    p = {k: torch.cat([s[k] for s in seqs]) for k in seqs[0]}  # [G, ...]
    y, h = selective_state_update(h0, p["u"], p["dt"], a, p["b"], p["c"], d, p["z"])
    for i, s in enumerate(seqs):
        y_ref, h_ref = selective_scan_ref(s["u"], s["dt"], a, s["b"], s["c"], d, s["z"], h0[i])
        torch.testing.assert_close(y[i], y_ref[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(h[i], h_ref, atol=1e-6, rtol=1e-6)


def _conv_ref(
    x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: x [L, C], state [C, K-1] -> (silu(conv) [L, C], last K-1 inputs)."""
    seq = torch.cat((state.t(), x))  # [K-1+L, C]
    out = F.conv1d(seq.t()[None], w[:, None], bias, groups=x.shape[1])[0].t()
    return F.silu(out), seq[-(K - 1) :].t()


def test_causal_conv_over_padded_batch_and_update():
    gen = torch.Generator().manual_seed(3)
    c = 6
    w, bias = torch.randn(c, K, generator=gen), torch.randn(c, generator=gen)
    lengths = [1, 2, 5, 11]  # shorter and longer than the K-1 = 3 state
    xs = [torch.randn(n, c, generator=gen) for n in lengths]
    states = torch.randn(len(lengths), c, K - 1, generator=gen)
    padded = torch.stack([torch.cat((x, torch.randn(11 - len(x), c))) for x in xs])
    out, new = causal_conv1d_fn(padded, w, bias, states, torch.tensor(lengths))
    for i, x in enumerate(xs):
        out_ref, new_ref = _conv_ref(x, states[i], w, bias)
        torch.testing.assert_close(out[i, : lengths[i]], out_ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(new[i], new_ref)
    # The one-token update == the padded path on the first token of each sequence.
    first = torch.stack([x[0] for x in xs])
    out1, new1 = causal_conv1d_update(first, states, w, bias)
    out_ref, new_ref = causal_conv1d_fn(
        first[:, None], w, bias, states, torch.ones(len(xs), dtype=torch.long)
    )
    torch.testing.assert_close(out1, out_ref[:, 0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(new1, new_ref)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_update(first, states, w, bias, activation="gelu")


def test_state_groups_split_decodes_from_prefills():
    # Requests: 3 tokens (slot 7), 1 (slot 2, fresh), 0 (skipped), 2 (slot 5).
    groups = build_state_groups(
        [0, 3, 4, 4, 6], torch.device("cpu"), [7, 2, 9, 5], [True, False, True, True]
    )
    decode, prefill = groups
    assert decode.token_index.tolist() == [[3]] and decode.slots.tolist() == [2]
    assert decode.has_initial_state.tolist() == [False]
    assert prefill.token_index.tolist() == [[0, 1, 2], [4, 5, 5]]  # padding clamps
    assert prefill.mask.tolist() == [[True] * 3, [True, True, False]]
    assert prefill.flat_index.tolist() == [0, 1, 2, 4, 5]
    assert prefill.slots.tolist() == [7, 5] and prefill.lengths.tolist() == [3, 2]
    states = torch.arange(10.0)[:, None].expand(10, 2).contiguous()
    assert decode.gather_states(states, torch.float32).tolist() == [[0.0, 0.0]]
    assert prefill.gather_states(states, torch.float32).tolist() == [[7.0] * 2, [5.0] * 2]
    prefill.scatter_states(states, torch.full((2, 2), -1.0))
    assert states[:, 0].tolist() == [0, 1, 2, 3, 4, -1, 6, -1, 8, 9]
    stateless = build_state_groups([0, 4], torch.device("cpu"))
    assert len(stateless) == 1 and stateless[0].slots is None
    with pytest.raises(ValueError, match="state slots"):
        build_state_groups([0, 1, 2], torch.device("cpu"), [0])
    with pytest.raises(ValueError, match="decrease"):
        build_state_groups([0, 2, 1], torch.device("cpu"), [0, 1], [True, True])
