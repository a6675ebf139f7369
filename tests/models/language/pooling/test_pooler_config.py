"""PoolerConfig as upstream v0.28: `pooling_type` fills seq_pooling_type or
tok_pooling_type, the removed fields are refused (`normalize` with upstream's
message, softmax / activation / logit_bias as unknown fields), `task` picks
the model's pooling task, and logit_mean / logit_sigma calibrate a
classifier's logits before its activation (checked against transformers)."""

from __future__ import annotations

import pytest
import torch

from tests.models.language.pooling.st_utils import ENGINE, make_seq_cls_model
from tests.models.language.pooling.test_classification import TEXTS, _hf_logits
from vllm import LLM, PoolingParams
from vllm.config.pooler import PoolerConfig

pytestmark = pytest.mark.usefixtures("in_process_engine")


def test_pooling_type_fills_the_seq_or_tok_field():
    mean = PoolerConfig.from_cli('{"pooling_type": "mean"}')
    assert (mean.seq_pooling_type, mean.tok_pooling_type) == ("MEAN", None)
    step = PoolerConfig.from_cli({"pooling_type": "STEP", "step_tag_id": 3})
    assert (step.seq_pooling_type, step.tok_pooling_type) == (None, "STEP")
    both = PoolerConfig(seq_pooling_type="CLS", tok_pooling_type="ALL")
    assert both.get_seq_pooling_type() == "CLS" and both.get_tok_pooling_type() == "ALL"
    with pytest.raises(ValueError, match="Cannot set both `pooling_type` and `seq_pooling_type`"):
        PoolerConfig(pooling_type="LAST", seq_pooling_type="MEAN")
    with pytest.raises(ValueError, match="Cannot set both `pooling_type` and `tok_pooling_type`"):
        PoolerConfig(pooling_type="LAST", tok_pooling_type="ALL")
    with pytest.raises(ValueError, match=r"seq_pooling_type='ALL' is not a pooling type"):
        PoolerConfig(seq_pooling_type="ALL")
    with pytest.raises(ValueError, match="tok_pooling_type is not set"):
        PoolerConfig().get_tok_pooling_type()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"normalize": False}, "Parameter `normalize` was removed; use `use_activation` instead."),
        ({"task": "score"}, "`score` task was removed; use `classify` instead."),
        ({"task": "encode"}, "`encode` task was removed"),
        ({"task": "generate"}, "is not a pooling task"),
        ({"softmax": True}, r"unknown field\(s\) \['softmax'\]"),
        ({"activation": True}, r"unknown field\(s\) \['activation'\]"),
        ({"logit_bias": 1.0}, r"unknown field\(s\) \['logit_bias'\]"),
        ({"logit_sigma": 0}, "logit_sigma cannot be 0"),
        ({"pooling_type": "MAX"}, "is not a pooling type"),
    ],
)
def test_refusals(data, message):
    with pytest.raises(ValueError, match=message):
        PoolerConfig.from_cli(data)


def test_logit_calibration_and_task(tmp_path):
    """softmax((logit - mean) / sigma) against transformers' logits; the
    configured task is the model's pooling task (a supported one only)."""
    model_dir = make_seq_cls_model("qwen2", str(tmp_path / "cls"), num_labels=3)
    mean, sigma = 0.75, 2.5
    llm = LLM(
        model_dir,
        pooler_config={"logit_mean": mean, "logit_sigma": sigma, "task": "token_classify"},
        **ENGINE,
    )
    try:
        mc = llm.model_config
        assert mc.get_pooling_task(llm.supported_tasks) == "token_classify"
        outs = llm.classify(TEXTS, use_tqdm=False)
        ref = (_hf_logits(model_dir, [o.prompt_token_ids for o in outs]) - mean) / sigma
        probs = torch.tensor([o.outputs.probs for o in outs])
        torch.testing.assert_close(probs, ref.softmax(-1), atol=1e-4, rtol=0)
        raw = llm.classify(
            TEXTS[:1], pooling_params=PoolingParams(use_activation=False), use_tqdm=False
        )
        torch.testing.assert_close(torch.tensor(raw[0].outputs.probs), ref[0], atol=1e-4, rtol=0)
        with pytest.raises(RuntimeError, match="Unsupported task: 'embed'"):
            mc.pooler_config.task = "embed"
            mc.get_pooling_task(llm.supported_tasks)
    finally:
        llm.llm_engine.shutdown()
