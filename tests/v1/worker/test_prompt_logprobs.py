"""The V1 runner's PromptLogprobsWorker (vllm/v1/worker/prompt_logprobs.py) on
its own: chunked prompts, a step the request sits out, and a request that
comes back after its prompt was done."""

from types import SimpleNamespace

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.prompt_logprobs import PromptLogprobsWorker

VOCAB = 11
PROMPT = [3, 7, 1, 9, 4, 2, 8]  # P = 7 tokens -> 6 entries


def _hidden(num_tokens: int, seed: int) -> torch.Tensor:
    # The "model" is the identity: hidden states are the logits.
    return torch.randn(num_tokens, VOCAB, generator=torch.Generator().manual_seed(seed))


def _batch(rows: dict[str, int], num_computed: dict[str, int]) -> SimpleNamespace:
    computed = np.zeros(len(rows), dtype=np.int32)
    for req_id, row in rows.items():
        computed[row] = num_computed[req_id]
    return SimpleNamespace(req_id_to_index=rows, num_computed_tokens_cpu=computed)


def _step(worker, rows, num_computed, num_scheduled, hidden):
    """One step; every request's tokens follow the previous one's, in row order."""
    query_start_loc = np.concatenate([[0], np.cumsum([num_scheduled[r] for r in rows])])
    return worker.compute_prompt_logprobs(
        lambda h: h, hidden, _batch(rows, num_computed), query_start_loc, num_scheduled
    )


def test_chunks_fill_one_tensor_returned_with_the_last_chunk():
    worker = PromptLogprobsWorker(VOCAB, torch.device("cpu"))
    worker.add_request("a", PROMPT, SamplingParams(prompt_logprobs=2))
    worker.add_request("n", [1, 2], SamplingParams())  # no prompt logprobs asked
    h1, h2 = _hidden(4, 0), _hidden(3, 1)
    # Step 1: "a" computes positions 0..3, "n" its 2 tokens after them.
    assert (
        _step(
            worker,
            {"a": 0, "n": 1},
            {"a": 0, "n": 0},
            {"a": 4, "n": 2},
            torch.cat([h1, _hidden(2, 9)]),
        )
        == {}
    )
    # Step 2: "a" sits out (not scheduled): nothing happens to it.
    assert _step(worker, {"n": 0}, {"n": 2}, {"n": 1}, _hidden(1, 3)) == {}
    # Step 3: the prompt's last chunk, positions 4..6.
    out = _step(worker, {"a": 0}, {"a": 4}, {"a": 3}, h2)
    tensors = out["a"]
    assert tensors.logprobs.shape == (len(PROMPT) - 1, 3)
    # Entry i: the logprob of prompt token i + 1 under the logits at position i.
    logits = torch.cat([h1, h2[:2]])
    want = logits.log_softmax(-1)[torch.arange(6), torch.tensor(PROMPT[1:])]
    torch.testing.assert_close(tensors.logprobs[:, 0], want)
    assert tensors.logprob_token_ids[:, 0].tolist() == PROMPT[1:]
    assert not worker.requests and not worker.in_progress


def test_request_back_after_its_prompt_is_not_tracked_again():
    worker = PromptLogprobsWorker(VOCAB, torch.device("cpu"))
    worker.add_request("a", PROMPT, SamplingParams(prompt_logprobs=1))
    assert set(_step(worker, {"a": 0}, {"a": 0}, {"a": 7}, _hidden(7, 0))) == {"a"}
    # Preempted, then recomputed from position 0: its logprobs went out already.
    assert _step(worker, {"a": 0}, {"a": 0}, {"a": 7}, _hidden(7, 1)) == {}


def test_finished_mid_prompt_is_dropped():
    worker = PromptLogprobsWorker(VOCAB, torch.device("cpu"))
    worker.add_request("a", PROMPT, SamplingParams(prompt_logprobs=-1))  # whole vocabulary
    assert _step(worker, {"a": 0}, {"a": 0}, {"a": 3}, _hidden(3, 0)) == {}
    assert worker.in_progress["a"].logprobs.shape == (6, VOCAB + 1)
    worker.remove_request("a")
    assert not worker.requests and not worker.in_progress
