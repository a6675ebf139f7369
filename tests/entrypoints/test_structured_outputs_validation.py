"""Structured-output constraints are checked in the engine's front end
(`InputProcessor._validate_structured_output`): one xgrammar cannot compile,
a backend that is not built, or a missing tokenizer is a `VLLMValidationError`
(a ValueError) before the request reaches the engine core, which keeps
serving; `--structured-outputs-config` reaches `VllmConfig` (upstream:
tests/v1/entrypoints/llm/test_struct_output_generate.py,
tests/v1/engine/test_processor.py)."""

from __future__ import annotations

import pytest

from tests.entrypoints.utils import make_inproc_llm
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams
from vllm.utils.argparse_utils import FlexibleArgumentParser

PROMPT = {"prompt_token_ids": [4, 8, 15, 16, 23, 42]}
GREEDY = dict(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_inproc_llm(tiny_model_dir("llama"))


def _params(**constraint) -> SamplingParams:
    return SamplingParams(**GREEDY, structured_outputs=StructuredOutputsParams(**constraint))


@pytest.mark.parametrize(
    "constraint, message",
    [
        (dict(regex="foo**"), "regex"),
        (dict(regex="[unclosed"), "regex"),
        (
            dict(json={"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
            "no-such-type",
        ),
        (dict(json="{not json"), "not JSON"),
        (dict(grammar="root ::= (("), "grammar"),
        (dict(grammar="  \n"), "empty"),
    ],
)
def test_invalid_constraint_raises_and_engine_keeps_serving(llm, constraint, message):
    with pytest.raises(ValueError, match=message) as exc:
        llm.generate(PROMPT, _params(**constraint), use_tqdm=False)
    assert isinstance(exc.value, VLLMValidationError)
    assert exc.value.parameter == "structured_outputs"
    engine = llm.llm_engine
    assert engine.get_num_unfinished_requests() == 0
    (out,) = llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == GREEDY["max_tokens"]


def test_valid_constraint_records_the_backend(llm):
    params = _params(regex="[0-9]{2}")
    llm.llm_engine.input_processor._validate_structured_output(params)
    so = params.structured_outputs
    assert so._backend == "xgrammar" and so._backend_was_auto
    # Params reused after "auto" picked xgrammar are still accepted.
    llm.llm_engine.input_processor._validate_structured_output(params)
    # A backend chosen per request is not (upstream's rule).
    params.structured_outputs._backend = "guidance"
    params.structured_outputs._backend_was_auto = False
    with pytest.raises(VLLMValidationError, match="Request-level"):
        llm.llm_engine.input_processor._validate_structured_output(params)


def test_constraint_without_tokenizer_is_refused(tiny_model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(
            model=tiny_model_dir("llama"),
            dtype="float32",
            max_model_len=64,
            kv_cache_memory_bytes=8 * 2**20,
            skip_tokenizer_init=True,
        )
    with pytest.raises(VLLMValidationError, match="skip_tokenizer_init"):
        llm.generate(PROMPT, _params(choice=["a", "b"]), use_tqdm=False)
    (out,) = llm.generate(
        PROMPT, SamplingParams(**GREEDY, ignore_eos=True, detokenize=False), use_tqdm=False
    )
    assert len(out.outputs[0].token_ids) == GREEDY["max_tokens"]


def _parse(argv: list[str]) -> EngineArgs:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(argv))


def test_structured_outputs_config_flag(tiny_model_dir):
    model = tiny_model_dir("llama")
    default = _parse(["--model", model]).create_engine_config()
    assert default.structured_outputs_config.backend == "auto"
    args = _parse(
        [
            "--model",
            model,
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
        ]
    )
    config = args.create_engine_config().structured_outputs_config
    assert config.backend == "xgrammar" and config.disable_any_whitespace is True
    with pytest.raises(SystemExit):
        _parse(["--structured-outputs-config", "not json"])
    with pytest.raises(ValueError, match="no_such_key"):
        _parse(
            ["--model", model, "--structured-outputs-config", '{"no_such_key": 1}']
        ).create_engine_config()


@pytest.mark.parametrize(
    "backend, message", [("guidance", "not built"), ("no-such-backend", "no-such-backend")]
)
def test_unbuilt_or_unknown_backend_is_refused(tiny_model_dir, backend, message):
    args = _parse(
        [
            "--model",
            tiny_model_dir("llama"),
            "--structured-outputs-config",
            f'{{"backend": "{backend}"}}',
        ]
    )
    with pytest.raises(ValueError, match=message):
        args.create_engine_config()
