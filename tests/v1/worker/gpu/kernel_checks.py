"""Triton-vs-torch checks of Model Runner V2's kernels, plus a plain-Python
reference for each.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when
vllm.v1.worker.gpu.* is first imported, so these checks run in a fresh
interpreter with TRITON_INTERPRET=1 (see `run_checks`); `python -m
tests.v1.worker.gpu.kernel_checks NAME...` prints a JSON verdict per check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable

import numpy as np
import torch

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _batch(seed: int, num_reqs: int = 6, max_num_reqs: int = 10, max_model_len: int = 64):
    """A random batch: rows, prefill/decode progress, tokens. Odd seeds give a
    batch of one token per request (decodes, and prefills down to their last
    token), which the torch paths handle on a shortcut."""
    g = np.random.default_rng(seed)
    one_token_each = seed % 2 == 1
    rows = g.permutation(max_num_reqs)[:num_reqs].astype(np.int64)
    prefill_len = g.integers(1, 40, max_num_reqs).astype(np.int32)
    computed = np.zeros(max_num_reqs, dtype=np.int32)
    query_lens = np.zeros(num_reqs, dtype=np.int32)
    # Kinds in a shuffled order: decode, a prefill chunk that leaves more to
    # do, a prefill chunk that completes the prefill (seq_len == prefill_len).
    kinds = g.permutation([i % 3 for i in range(num_reqs)])
    for i, r in enumerate(rows):
        if kinds[i] == 0:  # decode: prefill done, maybe some tokens generated
            computed[r] = prefill_len[r] + g.integers(0, 5)
            query_lens[i] = 1
            continue
        prefill_len[r] = max(prefill_len[r], 2)
        if kinds[i] == 1:  # a chunk (of one token, or more) that leaves more to do
            remaining = int(g.integers(2, prefill_len[r] + 1))
            query_lens[i] = 1 if one_token_each else int(g.integers(1, remaining))
        else:  # the rest of the prefill, possibly from position 0
            remaining = 1 if one_token_each else int(g.integers(1, prefill_len[r] + 1))
            query_lens[i] = remaining
        computed[r] = prefill_len[r] - remaining
    qsl = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=qsl[1:])
    tokens = g.integers(0, 1000, (max_num_reqs, max_model_len)).astype(np.int32)
    last = g.integers(0, 1000, (max_num_reqs, 1)).astype(np.int64)
    return dict(
        rows=rows,
        prefill_len=prefill_len,
        computed=computed,
        qsl=qsl,
        tokens=tokens,
        last=last,
        num_tokens=int(qsl[-1]),
    )


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).clone()


def _assert_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if not torch.equal(a, b):
        raise AssertionError(f"{what} differs:\n{a}\n{b}")


@check
def check_prepare_prefill_inputs() -> None:
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import input_batch_kernels as k

    for seed in range(5):
        b = _batch(seed)
        n = b["num_tokens"]
        want = np.full(n + 3, -7, dtype=np.int32)
        for i, r in enumerate(b["rows"]):
            s, e = b["qsl"][i], b["qsl"][i + 1]
            if b["computed"][r] < b["prefill_len"][r]:
                c = b["computed"][r]
                want[s:e] = b["tokens"][r, c : c + e - s]
        outs = []
        for fn in (ib._prepare_prefill_inputs_torch, k.prepare_prefill_inputs_triton):
            out = torch.full((n + 3,), -7, dtype=torch.int32)
            fn(
                out,
                _t(b["rows"]),
                _t(b["qsl"]),
                _t(b["tokens"]),
                _t(b["prefill_len"]),
                _t(b["computed"]),
                n,
            )
            outs.append(out)
        _assert_equal(outs[0], _t(want), "torch vs reference")
        _assert_equal(outs[1], outs[0], "triton vs torch")


@check
def check_prepare_pos_seq_lens() -> None:
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import input_batch_kernels as k

    for seed in range(5):
        b = _batch(seed)
        n, num_reqs = b["num_tokens"], len(b["rows"])
        want_pos = np.zeros(n, dtype=np.int64)
        want_seq = np.zeros(12, dtype=np.int32)
        for i, r in enumerate(b["rows"]):
            s, e = b["qsl"][i], b["qsl"][i + 1]
            want_pos[s:e] = b["computed"][r] + np.arange(e - s)
            want_seq[i] = b["computed"][r] + e - s
        outs = []
        for fn in (ib._prepare_pos_seq_lens_torch, k.prepare_pos_seq_lens_triton):
            pos = torch.full((n,), -1, dtype=torch.int64)
            seq = torch.full((12,), 99, dtype=torch.int32)
            fn(_t(b["rows"]), _t(b["qsl"]), _t(b["computed"]), pos, seq, n)
            outs.append((pos, seq))
        assert num_reqs < 12
        _assert_equal(outs[0][0], _t(want_pos), "positions (torch)")
        _assert_equal(outs[0][1], _t(want_seq), "seq_lens (torch)")
        _assert_equal(outs[1][0], outs[0][0], "positions (triton)")
        _assert_equal(outs[1][1], outs[0][1], "seq_lens (triton)")


def _combine_case(seed: int, num_spec: int):
    b = _batch(seed)
    g = np.random.default_rng(100 + seed)
    num_reqs = len(b["rows"])
    seq_lens = np.array([b["computed"][r] for r in b["rows"]], dtype=np.int32)
    seq_lens += np.diff(b["qsl"])
    # Decodes may carry drafts: extend their query by the draft count.
    drafts_per_req = np.zeros(num_reqs, dtype=np.int32)
    for i, r in enumerate(b["rows"]):
        if num_spec and b["computed"][r] >= b["prefill_len"][r]:
            drafts_per_req[i] = g.integers(0, num_spec + 1)
    query_lens = np.diff(b["qsl"]) + drafts_per_req
    qsl = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=qsl[1:])
    seq_lens += drafts_per_req
    cu = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(drafts_per_req + 1, out=cu[1:])
    draft_tokens = g.integers(2000, 3000, (10, num_spec)).astype(np.int64)
    return b, qsl, seq_lens, cu, draft_tokens


def _combine_reference(b, qsl, seq_lens, cu, draft_tokens, n):
    ids = np.arange(n, dtype=np.int32) + 5000
    idx = []
    for i, r in enumerate(b["rows"]):
        nl = cu[i + 1] - cu[i]
        first = qsl[i + 1] - nl
        idx.extend(range(first, first + nl))
        if seq_lens[i] > b["prefill_len"][r]:
            if seq_lens[i] - nl >= b["prefill_len"][r]:
                ids[first] = b["last"][r, 0]
            ids[first + 1 : first + nl] = draft_tokens[r, : nl - 1]
    return ids, np.array(idx, dtype=np.int64)


@check
def check_combine_sampled_and_draft_tokens() -> None:
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import input_batch_kernels as k

    for seed in range(6):
        num_spec = seed % 3  # 0: plain decoding; 1-2: with draft tokens
        b, qsl, seq_lens, cu, drafts = _combine_case(seed, num_spec)
        n = int(qsl[-1])
        want_ids, want_idx = _combine_reference(b, qsl, seq_lens, cu, drafts, n)
        outs = []
        for fn in (
            ib._combine_sampled_and_draft_tokens_torch,
            k.combine_sampled_and_draft_tokens_triton,
        ):
            ids = torch.arange(n, dtype=torch.int32) + 5000
            idx = fn(
                ids,
                _t(b["rows"]),
                _t(b["last"]),
                _t(qsl),
                _t(seq_lens),
                _t(b["prefill_len"]),
                _t(drafts),
                _t(cu),
                int(cu[-1]),
            )
            outs.append((ids, idx))
        _assert_equal(outs[0][0], _t(want_ids), "input_ids (torch)")
        _assert_equal(outs[0][1], _t(want_idx), "logits_indices (torch)")
        _assert_equal(outs[1][0], outs[0][0], "input_ids (triton)")
        _assert_equal(outs[1][1], outs[0][1], "logits_indices (triton)")


@check
def check_get_num_sampled_and_rejected() -> None:
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import input_batch_kernels as k

    for seed in range(4):
        b, qsl, seq_lens, cu, _ = _combine_case(seed, num_spec=2)
        g = np.random.default_rng(seed)
        num_logits = np.diff(cu)
        sampled = np.array([g.integers(1, nl + 1) for nl in num_logits], dtype=np.int32)
        chunked = seq_lens < b["prefill_len"][b["rows"]]
        want_s = np.where(chunked, 0, sampled)
        want_r = np.where(chunked, 0, num_logits - sampled)
        outs = [
            fn(_t(sampled), _t(seq_lens), _t(cu), _t(b["rows"]), _t(b["prefill_len"]))
            for fn in (
                ib._get_num_sampled_and_rejected_torch,
                k.get_num_sampled_and_rejected_triton,
            )
        ]
        _assert_equal(outs[0][0], _t(want_s), "num_sampled (torch)")
        _assert_equal(outs[0][1], _t(want_r.astype(np.int32)), "num_rejected (torch)")
        for a, c in zip(outs[1], outs[0]):
            _assert_equal(a, c, "triton vs torch")


@check
def check_post_update() -> None:
    from vllm.v1.worker.gpu import input_batch as ib
    from vllm.v1.worker.gpu import input_batch_kernels as k

    for seed in range(4):
        g = np.random.default_rng(seed)
        b = _batch(seed)
        num_reqs = len(b["rows"])
        rows = b["rows"].copy()
        if seed < 2:
            rows[g.integers(0, num_reqs)] = -1  # a skipped position
        width = 1 if seed % 2 else 3
        sampled = g.integers(0, 1000, (num_reqs, width)).astype(np.int64)
        num_sampled = g.integers(0, width + 1, num_reqs).astype(np.int32)
        num_rejected = g.integers(0, 2, num_reqs).astype(np.int32)
        total = (b["prefill_len"] + g.integers(0, 10, 10)).astype(np.int32)
        want = dict(
            ids=b["tokens"].copy(),
            last=b["last"].copy(),
            total=total.copy(),
            computed=b["computed"].copy(),
        )
        for i, r in enumerate(rows):
            if r < 0:
                continue
            ns = num_sampled[i]
            want["ids"][r, total[r] : total[r] + ns] = sampled[i, :ns]
            if ns:
                want["last"][r, 0] = sampled[i, ns - 1]
                want["total"][r] += ns
            want["computed"][r] += b["qsl"][i + 1] - b["qsl"][i] - num_rejected[i]
        for fn in (ib._post_update_torch, k.post_update_triton):
            ids, last, tot, comp = (_t(b["tokens"]), _t(b["last"]), _t(total), _t(b["computed"]))
            fn(
                _t(rows),
                comp,
                last,
                _t(sampled),
                _t(num_sampled),
                _t(num_rejected),
                _t(b["qsl"]),
                ids,
                tot,
            )
            name = fn.__name__
            _assert_equal(ids, _t(want["ids"]), f"all_token_ids ({name})")
            _assert_equal(last, _t(want["last"]), f"last_sampled ({name})")
            _assert_equal(tot, _t(want["total"]), f"total_len ({name})")
            _assert_equal(comp, _t(want["computed"]), f"num_computed ({name})")


@check
def check_compute_slot_mapping() -> None:
    from vllm.v1.worker.gpu import block_table as bt

    for seed in range(4):
        b = _batch(seed)
        g = np.random.default_rng(seed)
        block_size = int(g.choice([4, 16]))
        table = g.integers(0, 500, (10, 64 // block_size + 1)).astype(np.int32)
        pos = np.concatenate(
            [
                b["computed"][r] + np.arange(b["qsl"][i + 1] - b["qsl"][i])
                for i, r in enumerate(b["rows"])
            ]
        ).astype(np.int64)
        want = np.full(80, -1, dtype=np.int64)
        t = 0
        for i, r in enumerate(b["rows"]):
            for p in pos[b["qsl"][i] : b["qsl"][i + 1]]:
                want[t] = table[r, p // block_size] * block_size + p % block_size
                t += 1
        for fn in (bt._compute_slot_mapping_torch, bt._compute_slot_mapping_triton):
            out = torch.full((80,), 12345, dtype=torch.int64)
            fn(out, _t(table), block_size, _t(b["rows"]), _t(b["qsl"]), _t(pos))
            _assert_equal(out, _t(want), f"slot mapping ({fn.__name__})")


@check
def check_apply_staged_writes() -> None:
    from vllm.v1.worker.gpu import buffer_utils as bu

    g = np.random.default_rng(0)
    for dtype, shape in ((torch.int32, (6, 40)), (torch.float32, (6, 40)), (torch.int64, (9,))):
        writes = [
            (
                int(g.integers(0, shape[0])),
                0 if len(shape) == 1 else int(g.integers(0, 20)),
                g.integers(0, 100, 1 if len(shape) == 1 else int(g.integers(1, 20))),
            )
            for _ in range(5)
        ]
        want = torch.zeros(shape, dtype=dtype)
        for row, start, vals in writes:
            if len(shape) == 1:
                want[row] = float(vals[0])
            else:
                want[row, start : start + len(vals)] = torch.tensor(vals, dtype=dtype)
        indices = np.array([w[0] for w in writes])
        starts = np.array([w[1] for w in writes])
        cu = np.cumsum([len(w[2]) for w in writes])
        contents = torch.tensor(np.concatenate([w[2] for w in writes]), dtype=dtype)
        # Triton only sees distinct rows here; overlapping writes race across programs.
        for fn in (bu._apply_write_torch, bu._apply_write_triton):
            out = torch.zeros(shape, dtype=dtype)
            fn(out, indices, starts, contents, cu)
            if fn is bu._apply_write_triton and len(set(indices.tolist())) < len(indices):
                continue
            _assert_equal(out, want, f"staged writes {dtype} ({fn.__name__})")


@check
def check_gumbel_sample() -> None:
    from vllm.v1.worker.gpu.sample import gumbel

    g = np.random.default_rng(0)
    num_rows, vocab = 48, 1500  # vocab > BLOCK_SIZE: the kernel's block loop is used
    for scale in (1.0, 5.0):
        logits = torch.from_numpy(g.standard_normal((num_rows, vocab)).astype(np.float32))
        logits *= scale
        rows = g.permutation(64)[:num_rows].astype(np.int64)
        temp = g.choice([0.0, 0.7, 1.0], 64).astype(np.float32)
        seeds = g.integers(-(2**63), 2**63 - 1, 64, dtype=np.int64)
        pos = g.integers(0, 2**31 - 1, num_rows).astype(np.int64)
        args = (logits, _t(rows), _t(temp), _t(seeds), _t(pos))
        want_torch = gumbel._gumbel_sample_torch(*args, None)
        got = gumbel._gumbel_sample_triton(*args)
        _assert_equal(got, want_torch, "gumbel sample (triton vs torch)")
        greedy = temp[rows] == 0.0
        _assert_equal(want_torch[_t(greedy)], logits[_t(greedy)].argmax(-1), "greedy rows")
        # The noise really moves the random rows' tokens away from argmax.
        assert (want_torch[_t(~greedy)] != logits[_t(~greedy)].argmax(-1)).any()


def run_checks(names: list[str]) -> dict[str, str]:
    """Run the named checks under the Triton interpreter; name -> "ok" or a traceback."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _run_here(names)
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(
        os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.v1.worker.gpu.kernel_checks", *names],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kernel checks failed to run:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_here(names: list[str]) -> dict[str, str]:
    results = {}
    for name in names:
        try:
            CHECKS[name]()
            results[name] = "ok"
        except Exception:  # report every failure, not only the first
            results[name] = traceback.format_exc()
    return results


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(_run_here(sys.argv[1:] or list(CHECKS))))
