"""The Model Runner V2 rejection sampler
(vllm/v1/worker/gpu/spec_decode/rejection_sampler.py) on hand-made batches.

Greedy: exactly the accepted prefix (draft == argmax) then the argmax.
Random: the emitted tokens follow the target distribution after the sampling
parameters (chi-square per position over 3000 seeded requests, as
tests/v1/sample/test_rejection_sampler.py does for V1), and the test catches
an always-accepting verifier. A seeded request's result does not depend on
its batch-mates or its batch position.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from vllm import SamplingParams
from vllm.v1.worker.gpu.input_batch import InputBatch
from vllm.v1.worker.gpu.sample.sampler import Sampler
from vllm.v1.worker.gpu.spec_decode import rejection_sampler as rs
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

CPU = torch.device("cpu")
V = 8
MAX_LEN = 64


def make_batch(drafts: list[list[int]], rows: list[int], start: int = 10) -> InputBatch:
    """Requests in request rows `rows`, each a decode step [t0, d1..dn] at
    positions start..start+n whose every token is a logits row."""
    counts = np.array([1 + len(d) for d in drafts], dtype=np.int32)
    cu = np.zeros(len(drafts) + 1, dtype=np.int32)
    np.cumsum(counts, out=cu[1:])
    ids = np.concatenate([[1, *d] for d in drafts]).astype(np.int32)
    pos = np.concatenate([start + np.arange(c) for c in counts]).astype(np.int64)
    idx_np = np.asarray(rows, dtype=np.int64)
    idx = torch.from_numpy(idx_np)
    num_tokens = int(cu[-1])
    return InputBatch(
        req_ids=[f"r{r}" for r in rows],
        num_reqs=len(rows),
        idx_mapping=idx,
        idx_mapping_np=idx_np,
        expanded_idx_mapping=torch.repeat_interleave(idx, torch.from_numpy(counts)),
        num_scheduled_tokens=counts,
        num_tokens=num_tokens,
        num_tokens_after_padding=num_tokens,
        num_draft_tokens=int(counts.sum()) - len(rows),
        query_start_loc=torch.from_numpy(cu),
        query_start_loc_np=cu,
        seq_lens=torch.from_numpy(start + counts),
        seq_lens_np=start + counts,
        num_computed_tokens_np=np.full(len(rows), start, dtype=np.int32),
        input_ids=torch.from_numpy(ids),
        positions=torch.from_numpy(pos),
        logits_indices=torch.arange(num_tokens),
        cu_num_logits=torch.from_numpy(cu),
        cu_num_logits_np=cu,
    )


def make_sampler(params: list[SamplingParams], k: int) -> RejectionSampler:
    sampler = Sampler(len(params), V, CPU)
    for row, p in enumerate(params):
        sampler.add_request(row, 4, p)
    sampler.apply_staged_writes()
    return RejectionSampler(sampler, k)


def all_token_ids(n: int) -> torch.Tensor:
    return torch.zeros(n, MAX_LEN, dtype=torch.int32)


def test_greedy_accepts_the_argmax_prefix():
    g = torch.Generator().manual_seed(0)
    k = 3
    accept = [0, 1, 2, 3, 1, 0]  # accepted drafts per request
    num_drafts = [3, 3, 3, 3, 1, 2]
    logits = [torch.randn(n + 1, V, generator=g) for n in num_drafts]
    drafts = []
    for rows, a, n in zip(logits, accept, num_drafts):
        top = rows.argmax(-1).tolist()
        drafts.append([top[j] if j < a else (top[j] + 1) % V for j in range(n)])
    sampler = make_sampler([SamplingParams(temperature=0.0)] * len(drafts), k)
    batch = make_batch(drafts, list(range(len(drafts))))
    sampled, num_sampled, logprobs = sampler.verify(torch.cat(logits), batch, all_token_ids(6))
    assert logprobs is None
    assert num_sampled.tolist() == [a + 1 for a in accept]
    for i, (rows, a) in enumerate(zip(logits, accept)):
        want = drafts[i][:a] + [int(rows[a].argmax())]
        assert sampled[i].tolist() == want + [-1] * (k + 1 - len(want))


N = 3000
TARGET = torch.tensor(
    [
        [2.0, 1.0, 0.5, 0.0, -1.0, 0.3, 1.5, -0.5],
        [0.0, 2.0, 1.0, 1.0, -2.0, 0.0, 0.5, 0.1],
        [1.0, 0.0, 0.0, 2.0, 0.5, -1.0, 0.2, 0.0],
    ]
)
DRAFTS = [0, 1]  # likely tokens: every outcome (0, 1, 2 accepted) is common


def run_many(params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    reqs = [SamplingParams(**{**_fields(params), "seed": s}) for s in range(N)]
    sampler = make_sampler(reqs, 2)
    batch = make_batch([DRAFTS] * N, list(range(N)))
    sampled, num_sampled, _ = sampler.verify(TARGET.repeat(N, 1), batch, all_token_ids(N))
    return sampled, num_sampled


def _fields(p: SamplingParams) -> dict:
    return {"temperature": p.temperature, "top_k": p.top_k}


def expected_probs(temperature: float, top_k: int) -> torch.Tensor:
    logits = TARGET.double() / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, -1)


def pvalues(sampled: torch.Tensor, probs: torch.Tensor) -> list[float]:
    """Position j: the tokens of requests that reached it (accepted every
    earlier draft) against the target's row j."""
    out = []
    for j in range(3):
        reached = (
            (sampled[:, :j] == torch.tensor(DRAFTS[:j])).all(1) if j else torch.ones(N, dtype=bool)
        )
        col = sampled[reached, j].numpy()
        assert (col >= 0).all()
        counts = np.bincount(col, minlength=V)
        p = probs[j].numpy()
        support = p > 0
        assert counts[~support].sum() == 0  # nothing outside top-k
        out.append(chisquare(counts[support], p[support] * len(col)).pvalue)
    return out


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.7, 3)])
def test_random_output_matches_target_distribution(temperature, top_k):
    sampled, num_sampled = run_many(SamplingParams(temperature=temperature, top_k=top_k))
    # Every outcome occurs: first draft rejected, accepted, both accepted.
    hist = np.bincount(num_sampled.numpy(), minlength=4)
    assert (hist[1:] > 0.05 * N).all(), hist
    assert min(pvalues(sampled, expected_probs(temperature, top_k))) > 1e-3


def test_chi_square_catches_always_accepting(monkeypatch):
    monkeypatch.setattr(rs, "acceptance_uniforms", lambda seeds, pos: torch.zeros(len(pos)))
    sampled, num_sampled = run_many(SamplingParams(temperature=1.0))
    assert (num_sampled == 3).all()
    assert min(pvalues(sampled, expected_probs(1.0, 0))) < 1e-6


def test_seeded_request_independent_of_batch_mates():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4 * 3, V, generator=g)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 12, 13, 14)]
    sampler = make_sampler(params, 2)
    drafts = [[1, 2], [3, 4], [5, 6], [7, 0]]
    full, n_full, _ = sampler.verify(logits, make_batch(drafts, [0, 1, 2, 3]), all_token_ids(4))
    # Request row 2 alone, and first in a different batch.
    alone, n_alone, _ = sampler.verify(logits[6:9], make_batch(drafts[2:3], [2]), all_token_ids(4))
    swapped = torch.cat([logits[6:9], logits[0:3]])
    sw, n_sw, _ = sampler.verify(
        swapped, make_batch([drafts[2], drafts[0]], [2, 0]), all_token_ids(4)
    )
    assert full[2].tolist() == alone[0].tolist() == sw[0].tolist()
    assert n_full[2] == n_alone[0] == n_sw[0]
    assert full[0].tolist() == sw[1].tolist()


def test_logprobs_rows_follow_the_emitted_tokens():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, V, generator=g)
    top = logits.argmax(-1).tolist()
    sampler = make_sampler([SamplingParams(temperature=0.0, logprobs=2)], 2)
    batch = make_batch([[top[0], (top[1] + 1) % V]], [0])
    sampled, num_sampled, logprobs = sampler.verify(logits, batch, all_token_ids(1))
    assert num_sampled.tolist() == [2] and sampled[0, :2].tolist() == top[:2]
    assert logprobs is not None
    ids, values, _ = logprobs
    ref = torch.log_softmax(logits, -1)
    assert ids[:2, 0].tolist() == top[:2]  # the emitted token first, per row
    assert torch.allclose(values[:2, 0], ref[[0, 1], top[:2]])


def test_penalties_count_earlier_drafts_as_outputs():
    """Draft row 1 is penalised for draft 1 (staged into the request row):
    token 3 leads row 1 by 0.5, a frequency penalty of 1 for the accepted
    draft 3 hands the row to token 5, so the second draft (3 again) is rejected."""
    logits = torch.full((3, V), -5.0)
    logits[0, 3] = 4.0
    logits[1, 3], logits[1, 5] = 2.0, 1.5
    logits[2, 1] = 1.0
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    sampler = make_sampler([params], 2)
    sampled, num_sampled, _ = sampler.verify(logits, make_batch([[3, 3]], [0]), all_token_ids(1))
    assert num_sampled.tolist() == [2]
    assert sampled[0].tolist() == [3, 5, -1]
