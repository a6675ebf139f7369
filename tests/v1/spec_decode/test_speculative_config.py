"""SpeculativeConfig resolves and validates as upstream v0.28 (method, n-gram
window, draft model, rejection-sampling options); `--speculative-config` JSON
and the --spec-* shorthands reach it; the engine then refuses the methods not
built yet, naming the method, only after that validation."""

from __future__ import annotations

import pytest

from tests.utils import TINY_VOCAB, make_tiny_model
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("target")))


@pytest.fixture(scope="module")
def draft_other_vocab(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("draft-other-vocab")
    return make_tiny_model("llama", str(d), seed=1, vocab_size=TINY_VOCAB + 64)


def _engine_config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", **kwargs).create_engine_config()


@pytest.mark.parametrize(
    ("lookup", "want"),
    [
        ({}, (5, 5)),
        ({"prompt_lookup_max": 4}, (4, 4)),
        ({"prompt_lookup_min": 3}, (3, 3)),
        ({"prompt_lookup_min": 2, "prompt_lookup_max": 6}, (2, 6)),
    ],
)
def test_ngram_window_resolved_as_upstream(lookup, want):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, **lookup)
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == want
    assert spec.model == "ngram" and spec.num_speculative_tokens == 3
    assert not spec.use_eagle() and not spec.uses_draft_model()
    assert spec.max_num_new_slots_for_drafting == 0


def test_method_detected_from_model():
    assert SpeculativeConfig(model="ngram", num_speculative_tokens=2).method == "ngram"
    assert SpeculativeConfig(model="[ngram]", num_speculative_tokens=2).method == "ngram"
    # A dotted import path is a custom proposer class.
    custom = SpeculativeConfig(model="my_pkg.MyProposer", num_speculative_tokens=2)
    assert custom.method == "custom_class"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "lookahead", "num_speculative_tokens": 2}, ValueError, "'lookahead'"),
        ({"method": "[ngram]", "num_speculative_tokens": 2}, ValueError, "not a speculative"),
        (
            {"method": "ngram", "num_speculative_tokens": 0},
            ValueError,
            r"Expected num_speculative_tokens to be greater than zero \(0\)",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": -2},
            ValueError,
            r"greater than zero \(-2\)",
        ),
        ({"method": "ngram"}, ValueError, "num_speculative_tokens must be provided"),
        (
            {"method": "ngram", "num_speculative_tokens": "3"},
            ValueError,
            "num_speculative_tokens must be an integer",
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 3,
            },
            ValueError,
            "prompt_lookup_min=4 must be <= prompt_lookup_max=3",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
            ValueError,
            r"prompt_lookup_min=0 must be >= 1",
        ),
        (
            {"num_speculative_tokens": 2},
            ValueError,
            "num_speculative_tokens was provided but without speculative model",
        ),
        (
            {"method": "eagle", "num_speculative_tokens": 2},
            ValueError,
            "without speculative model",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "tensor_parallel_size": 2},
            ValueError,
            "Please pass 'draft_tensor_parallel_size' instead",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "use_heterogeneous_vocab": True},
            ValueError,
            "use_heterogeneous_vocab only works with method='draft_model'",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "enable_adaptive_verification": True},
            ValueError,
            "Adaptive verification only supported with DSpark",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "x"},
            ValueError,
            "rejection_sample_method='x'",
        ),
    ],
)
def test_bad_input_gets_upstreams_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        SpeculativeConfig(**kwargs)


def test_synthetic_acceptance_rates():
    def make(**kw):
        return SpeculativeConfig(
            method="ngram", num_speculative_tokens=3, rejection_sample_method="synthetic", **kw
        )

    # Mean length 2.5 -> 1.5 accepted drafts: one sure, one half, then none.
    assert make(synthetic_acceptance_length=2.5).synthetic_acceptance_rates == [1.0, 0.5, 0.0]
    assert make(synthetic_acceptance_rates=[0.9, 0.5, 0.5]).synthetic_acceptance_rates == [
        0.9, 0.5, 0.5,
    ]  # fmt: skip
    for kw, match in (
        ({}, "exactly one of"),
        ({"synthetic_acceptance_rates": [0.5, 0.6, 0.1]}, "non-increasing"),
        ({"synthetic_acceptance_rates": [0.5]}, "must have length 3"),
        ({"synthetic_acceptance_length": 4.5}, r"must be in \[1, 4\]"),
    ):
        with pytest.raises(ValueError, match=match):
            make(**kw)
    with pytest.raises(ValueError, match="only valid with rejection_sample_method='synthetic'"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=2, synthetic_acceptance_length=2)


def test_draft_model_config_built_and_checked(target, draft_other_vocab):
    target_cfg, parallel = ModelConfig(model=target), ParallelConfig()
    spec = SpeculativeConfig(
        model=target,
        num_speculative_tokens=2,
        max_model_len=64,
        target_model_config=target_cfg,
        target_parallel_config=parallel,
    )
    assert spec.method == "draft_model" and spec.uses_draft_model()
    assert spec.draft_model_config is not None
    assert spec.draft_model_config.max_model_len == 64
    assert spec.draft_tensor_parallel_size == 1
    assert spec.max_num_new_slots_for_drafting == 1
    common = dict(target_model_config=target_cfg, target_parallel_config=parallel)
    with pytest.raises(ValueError, match="Target and draft model should have the same vocabulary"):
        SpeculativeConfig(model=draft_other_vocab, num_speculative_tokens=2, **common)
    with pytest.raises(ValueError, match="`num_speculative_tokens` was not provided"):
        SpeculativeConfig(model=target, **common)
    with pytest.raises(ValueError, match="cannot be other value than 1 or target"):
        SpeculativeConfig(
            model=target, num_speculative_tokens=2, draft_tensor_parallel_size=2, **common
        )
    too_long = target_cfg.max_model_len + 1
    with pytest.raises(ValueError, match=f"speculative_max_model_len={too_long} cannot be larger"):
        SpeculativeConfig(model=target, num_speculative_tokens=2, max_model_len=too_long, **common)


def test_cli_json_parsed_and_built_into_the_engine_config(target):
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(
        ["-sc", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}']
    )
    assert args.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
    }
    engine_args = EngineArgs(model=target, device="cpu", speculative_config=args.speculative_config)
    spec = engine_args.create_speculative_config(ModelConfig(model=target), ParallelConfig())
    assert spec is not None and (spec.prompt_lookup_min, spec.prompt_lookup_max) == (4, 4)
    assert spec.draft_model_config is spec.target_model_config
    vllm_config = engine_args.create_engine_config()
    assert vllm_config.speculative_config is not None
    assert vllm_config.speculative_config.num_speculative_tokens == 3
    with pytest.raises(SystemExit):  # not a JSON object
        parser.parse_args(["--speculative-config", "[1, 2]"])


def test_spec_shorthands_merge_and_conflict(target):
    spec = _engine_config(target, spec_method="ngram", spec_tokens=2).speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("ngram", 2)
    spec = _engine_config(target, spec_model=target, spec_tokens=2).speculative_config
    assert spec is not None and spec.method == "draft_model"
    with pytest.raises(NotImplementedError, match="method 'ngram_gpu' is not built"):
        _engine_config(target, spec_method="ngram_gpu", spec_tokens=2)
    with pytest.raises(ValueError, match="--spec-tokens and --speculative-config"):
        _engine_config(target, speculative_config={"num_speculative_tokens": 2}, spec_tokens=3)
    with pytest.raises(ValueError, match=r"Unknown speculative_config key\(s\) \['k'\]"):
        _engine_config(target, speculative_config={"method": "ngram", "k": 2})
    # Bad input gets the specific error, not the "not built" refusal.
    with pytest.raises(ValueError, match="greater than zero"):
        _engine_config(target, spec_method="ngram", spec_tokens=0)
    # Without any speculative flag the engine config builds.
    assert _engine_config(target).speculative_config is None
