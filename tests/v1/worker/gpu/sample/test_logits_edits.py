"""The V2 sampler's logits edits read each request's tokens from its row of
`all_token_ids` (prompt = [0, prompt_len), outputs = [prompt_len, seq_len)):
penalties, bad words, min_tokens, allowed tokens and logit bias."""

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.sample.sampler import Sampler

CPU = torch.device("cpu")
VOCAB = 16


def setup(
    params: dict[int, SamplingParams], prompts: dict[int, list[int]], outputs: dict[int, list[int]]
):
    """A sampler with requests in the given rows, and their all_token_ids rows."""
    sampler = Sampler(max_num_reqs=6, vocab_size=VOCAB, device=CPU)
    all_token_ids = torch.full((6, 32), 15, dtype=torch.int32)  # stale: never counted
    for row, p in params.items():
        sampler.add_request(row, len(prompts[row]), p)
        tokens = prompts[row] + outputs[row]
        all_token_ids[row, : len(tokens)] = torch.tensor(tokens)
    sampler.apply_staged_writes()
    return sampler, all_token_ids


def edit(
    sampler, all_token_ids, rows: list[int], seq_lens: list[int], logits: torch.Tensor
) -> torch.Tensor:
    logits = logits.clone()
    sampler.apply_logits_edits(logits, np.array(rows), np.array(seq_lens), all_token_ids)
    return logits


def test_penalties_count_prompt_and_outputs_from_the_rows():
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    sampler, ids = setup({3: p, 1: SamplingParams()}, {3: [1, 2], 1: [4]}, {3: [2, 5, 5], 1: [4]})
    logits = torch.full((2, VOCAB), 1.0)
    logits[0, 1] = -1.0
    # Batch: row 3 (seq_len 5: prompt 1 2, outputs 2 5 5), row 1 (no penalties).
    out = edit(sampler, ids, [3, 1], [5, 2], logits)
    want = torch.full((VOCAB,), 1.0)
    want[1] = -1.0 * 2.0  # in the prompt, negative: multiplied
    want[2] = 1.0 / 2.0 - 0.5 * 1 - 0.25  # prompt and one output
    want[5] = 1.0 / 2.0 - 0.5 * 2 - 0.25  # two outputs
    torch.testing.assert_close(out[0], want)
    assert torch.equal(out[1], logits[1])
    # Only the tokens up to seq_len count: at seq_len 4 the second 5 is not there yet.
    out = edit(sampler, ids, [3], [4], logits[:1])
    assert abs(out[0, 5].item() - (0.5 - 0.5 - 0.25)) < 1e-6


def test_min_tokens_allowed_ids_and_bias():
    params = {
        0: SamplingParams(min_tokens=2, stop_token_ids=[7], max_tokens=8),
        2: SamplingParams(allowed_token_ids=[3, 4, 9], logit_bias={4: 2.0, 9: -1.0}),
    }
    sampler, ids = setup(params, {0: [1, 1, 1], 2: [2]}, {0: [], 2: []})
    logits = torch.zeros(2, VOCAB)
    # Row 0 has 1 output (seq_len 4, prompt 3): the stop token is still forbidden.
    out = edit(sampler, ids, [0, 2], [4, 1], logits)
    assert out[0, 7] == float("-inf") and (out[0, :7] == 0).all()
    allowed = {3: 0.0, 4: 2.0, 9: -1.0}
    for t in range(VOCAB):
        assert out[1, t].item() == allowed.get(t, float("-inf"))
    # With 2 outputs min_tokens is met.
    assert edit(sampler, ids, [0], [5], logits[:1])[0, 7] == 0


def test_bad_words_read_the_last_outputs():
    p = SamplingParams()
    p._bad_words_token_ids = [[6], [2, 3, 8]]
    sampler, ids = setup({4: p}, {4: [2, 3]}, {4: [1, 2, 3]})
    logits = torch.zeros(1, VOCAB)
    # Outputs end with 2 3: the word 2 3 8 would be completed -> 8 banned; 6 always.
    out = edit(sampler, ids, [4], [5], logits)
    assert {t for t in range(VOCAB) if out[0, t] == float("-inf")} == {6, 8}
    # At seq_len 4 the outputs are [1, 2]: only 6. The prompt's 2 3 never counts.
    out = edit(sampler, ids, [4], [3], logits)
    assert {t for t in range(VOCAB) if out[0, t] == float("-inf")} == {6}
