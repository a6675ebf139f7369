"""Reward models from a causal LM (`--convert reward`, upstream's
as_reward_model) through the whole engine, against transformers' last
hidden states of the same tiny Llama (float32, one prompt at a time):

- ALL pooling (the default): `LLM.reward` gives every prompt token's row,
  softmax over the hidden state, or the hidden state itself with
  use_activation=False;
- STEP pooling: only the rows of the prompt tokens equal to `step_tag_id`
  and of those only the `returned_token_ids` columns, then the softmax
  (a hand computation on transformers' states); per-request values override
  the pooler_config's;
- both with chunked prefill (a prompt longer than a step's token budget);
- the step fields refused where they would do nothing.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.language.pooling.st_utils import ENGINE
from tests.utils import make_tiny_model
from vllm import LLM, PoolingParams
from vllm.engine.arg_utils import EngineArgs

pytestmark = pytest.mark.usefixtures("in_process_engine")

TAG = 9  # the step tag's token id
# The long prompt spans 3 steps of 32 tokens; the last has no step tag.
PROMPTS = [
    [5, 17, TAG, 30, 31, TAG, 44, TAG],
    [7, TAG, *range(100, 170), TAG, 3, 4],
    [1, 2, 3],
]
CHUNKED = dict(enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=4)
ATOL = 1e-5


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("reward-llama")))


@pytest.fixture(scope="module")
def hf_hidden(llama_dir) -> list[torch.Tensor]:
    """transformers' last hidden state (after the final norm) per prompt."""
    import transformers as tf

    hf = tf.AutoModel.from_pretrained(llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [hf(torch.tensor([ids])).last_hidden_state[0] for ids in PROMPTS]


def _reward(llm: LLM, params=None) -> list[torch.Tensor]:
    prompts = [{"prompt_token_ids": ids} for ids in PROMPTS]
    return [o.outputs.data for o in llm.reward(prompts, pooling_params=params, use_tqdm=False)]


def _step_rows(hidden: torch.Tensor, ids: list[int], tag: int, cols: list[int]) -> torch.Tensor:
    """STEP by hand: the rows of the tag tokens, the listed columns, softmax."""
    return hidden[torch.tensor(ids) == tag][:, cols].softmax(-1)


def test_reward_all_pooling_is_every_tokens_hidden_state(llama_dir, hf_hidden):
    assert len(PROMPTS[1]) > CHUNKED["max_num_batched_tokens"]
    llm = LLM(llama_dir, runner="pooling", convert="reward", **CHUNKED, **ENGINE)
    try:
        assert llm.model_config.pooler_config.tok_pooling_type == "ALL"
        probs = _reward(llm)
        raw = _reward(llm, PoolingParams(use_activation=False))
        with pytest.raises(ValueError, match="embed"):  # token_classify is its only task
            llm.embed(["a"], use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    for ids, hidden, p, r in zip(PROMPTS, hf_hidden, probs, raw):
        assert r.shape == (len(ids), hidden.shape[-1])
        torch.testing.assert_close(r, hidden, atol=ATOL, rtol=0)
        torch.testing.assert_close(p, hidden.softmax(-1), atol=ATOL, rtol=0)


def test_step_pooling_keeps_the_step_tag_rows(llama_dir, hf_hidden):
    cols = [3, 10]
    pooler_config = {"pooling_type": "STEP", "step_tag_id": TAG, "returned_token_ids": cols}
    llm = LLM(
        llama_dir,
        runner="pooling",
        convert="reward",
        pooler_config=pooler_config,
        **CHUNKED,
        **ENGINE,
    )
    try:
        got = _reward(llm)
        # Per request: another tag (token 17 / 100, once each) and three columns.
        override = [
            PoolingParams(step_tag_id=tag, returned_token_ids=[0, 5, 63]) for tag in (17, 100, 1)
        ]
        got_override = _reward(llm, override)
    finally:
        llm.llm_engine.shutdown()
    for ids, hidden, out in zip(PROMPTS, hf_hidden, got):
        expected = _step_rows(hidden, ids, TAG, cols)
        assert out.shape == (ids.count(TAG), len(cols))
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
    assert got[2].shape == (0, 2)  # no step tag in the prompt: no rows
    for ids, hidden, out, tag in zip(PROMPTS, hf_hidden, got_override, (17, 100, 1)):
        assert out.shape == (1, 3)
        torch.testing.assert_close(out, _step_rows(hidden, ids, tag, [0, 5, 63]), atol=ATOL, rtol=0)


def _model_config(llama_dir: str, convert: str, pooler_config: dict):
    return EngineArgs(
        model=llama_dir, runner="pooling", convert=convert, pooler_config=pooler_config
    ).create_model_config()


def test_step_fields_refused_where_they_do_nothing(llama_dir):
    with pytest.raises(ValueError, match=r"step_tag_id needs pooling_type='STEP'"):
        _model_config(llama_dir, "reward", {"step_tag_id": TAG})
    # As upstream v0.28: STEP is a token pooling type (the token tasks'), the
    # sequence tasks keep the model's; a sequence type is refused on a model
    # with token tasks alone.
    step_embed = _model_config(llama_dir, "embed", {"pooling_type": "STEP"}).pooler_config
    assert (step_embed.seq_pooling_type, step_embed.tok_pooling_type) == ("LAST", "STEP")
    with pytest.raises(ValueError, match=r"seq_pooling_type='MEAN'.*pools token-wise only"):
        _model_config(llama_dir, "reward", {"pooling_type": "MEAN"})
    with pytest.raises(ValueError, match="returned_token_ids must be non-negative ints"):
        _model_config(llama_dir, "reward", {"pooling_type": "STEP", "returned_token_ids": [-1]})

    all_config = _model_config(llama_dir, "reward", {})
    with pytest.raises(ValueError, match=r"does not support \['step_tag_id'\]"):
        PoolingParams(step_tag_id=TAG).verify("token_classify", all_config)
    step_config = _model_config(llama_dir, "reward", {"pooling_type": "STEP"})
    hidden = step_config.get_hidden_size()
    with pytest.raises(ValueError, match=rf"returned_token_ids \[{hidden}\] are out of range"):
        PoolingParams(returned_token_ids=[hidden]).verify("token_classify", step_config)
    with pytest.raises(ValueError, match="step_tag_id must be a token id"):
        PoolingParams(step_tag_id="9").verify("token_classify", step_config)  # type: ignore[arg-type]
