"""EngineArgs: flags generated from the fields, the argparse round trip, and the
defaults `create_engine_config` resolves (upstream: tests/engine/test_arg_utils.py)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs, get_batch_defaults
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser, human_readable_int


def _parse(argv: list[str]) -> argparse.Namespace:
    return EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)


def test_every_field_has_a_kebab_case_flag():
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    flags = {s for a in parser._actions for s in a.option_strings}
    for f in dataclasses.fields(EngineArgs):
        assert "--" + f.name.replace("_", "-") in flags, f.name


def test_defaults_round_trip_unchanged():
    assert EngineArgs.from_cli_args(_parse([])) == EngineArgs()


@pytest.mark.parametrize(
    ("text", "value"),
    [("32k", 32000), ("32K", 32768), ("25.6k", 25600), ("1m", 10**6), ("2048", 2048)],
)
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value
    assert _parse(["--max-model-len", text]).max_model_len == value


def test_binary_suffix_rejects_decimals():
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int("1.5K")


def test_boolean_flags_are_optional_actions():
    assert _parse([]).enable_prefix_caching is None
    assert _parse(["--enable-prefix-caching"]).enable_prefix_caching is True
    assert _parse(["--no-enable-prefix-caching"]).enable_prefix_caching is False
    assert _parse(["--enforce-eager"]).enforce_eager is True
    assert _parse(["--no-enforce-eager"]).enforce_eager is False


def test_aliases_snake_case_and_json():
    args = _parse(
        [
            "-tp",
            "1",
            "--max_num_seqs",
            "7",
            "--hf-overrides",
            '{"rope_theta": 5.0}',
            "-cc",
            '{"mode": 0}',
            "--kv-cache-memory-bytes",
            "1G",
            "--served-model-name",
            "a",
            "b",
        ]
    )
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.tensor_parallel_size == 1
    assert engine_args.max_num_seqs == 7
    assert engine_args.hf_overrides == {"rope_theta": 5.0}
    assert engine_args.compilation_config == {"mode": 0}
    assert engine_args.kv_cache_memory_bytes == 2**30
    assert engine_args.served_model_name == ["a", "b"]


def test_bad_choice_is_rejected():
    with pytest.raises(SystemExit):
        _parse(["--scheduling-policy", "lifo"])


def test_round_trip_to_engine_config(tiny_model_dir):
    model = tiny_model_dir("llama")
    args = _parse(
        [
            "--model",
            model,
            "--max-model-len",
            "256",
            "--block-size",
            "32",
            "--no-enable-prefix-caching",
            "--max-num-seqs",
            "5",
            "--max-num-batched-tokens",
            "1k",
            "--scheduling-policy",
            "priority",
            "--kv-cache-memory-bytes",
            "8M",
            "--dtype",
            "float32",
            "--seed",
            "3",
            "--prefix-caching-hash-algo",
            "xxhash",
        ]
    )
    config = EngineArgs.from_cli_args(args).create_engine_config(UsageContext.LLM_CLASS)
    assert config.model_config.model == model
    assert config.model_config.max_model_len == 256
    assert str(config.model_config.dtype) == "torch.float32"
    assert config.model_config.seed == 3
    assert config.cache_config.block_size == 32
    assert config.cache_config.enable_prefix_caching is False
    assert config.cache_config.kv_cache_memory_bytes == 8 * 2**20
    assert config.cache_config.prefix_caching_hash_algo == "xxhash"
    assert config.scheduler_config.max_num_seqs == 5
    assert config.scheduler_config.max_num_batched_tokens == 1000
    assert config.scheduler_config.policy == "priority"
    assert config.scheduler_config.max_model_len == 256


def test_cpu_batch_defaults_follow_the_usage_context(tiny_model_dir):
    model = tiny_model_dir("llama")
    llm = EngineArgs(model=model).create_engine_config(UsageContext.LLM_CLASS)
    server = EngineArgs(model=model).create_engine_config(UsageContext.OPENAI_API_SERVER)
    other = EngineArgs(model=model).create_engine_config(None)
    assert llm.device_config.device_type == "cpu"
    assert (llm.scheduler_config.max_num_batched_tokens, llm.scheduler_config.max_num_seqs) == (
        4096,
        256,
    )
    assert (
        server.scheduler_config.max_num_batched_tokens,
        server.scheduler_config.max_num_seqs,
    ) == (2048, 128)
    assert (other.scheduler_config.max_num_batched_tokens, other.scheduler_config.max_num_seqs) == (
        2048,
        128,
    )
    assert llm.cache_config.enable_prefix_caching is True


def test_batch_defaults_scale_with_world_size_on_cpu():
    tokens, seqs = get_batch_defaults("cpu", 2)
    assert tokens[UsageContext.LLM_CLASS] == 8192
    assert seqs[UsageContext.OPENAI_API_SERVER] == 256


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        EngineArgs(model=str(tmp_path / "no-such-model")).create_engine_config()


def test_async_engine_args_add_their_flag():
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--enable-log-requests", "--max-num-seqs", "3"])
    async_args = AsyncEngineArgs.from_cli_args(args)
    assert async_args.enable_log_requests is True
    assert async_args.max_num_seqs == 3
