"""Every `vllm serve` flag and every JSON-config field either works (a named test
shows its effect) or refuses a non-default value with an error naming it.

The table below is the audit. Each row is one flag dest (as `vllm serve`'s parser
names it) or one field of a JSON-config flag ("compilation_config.mode"):

    ("tested", "tests/path.py::test_name")   the test exists and shows the effect
    ("refused", value)                        building the engine config (engine
                                              flags, on CPU) or validating the
                                              parsed serve args (front-end flags)
                                              with `value` raises an error whose
                                              message names the flag

A flag added to the parser without a row here, or a row whose flag is gone,
fails this test. Add your row when you add a flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from vllm.config import CompilationConfig, StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVING = "tests/entrypoints/openai/test_serving.py"
AUTH = "tests/entrypoints/openai/test_auth_and_limits.py"
FRONTEND = "tests/entrypoints/openai/test_frontend_flags.py"
EFFECTS = "tests/engine/test_engine_flag_effects.py"
DEFAULTS = "tests/engine/test_arg_utils_defaults.py"
ARGS = "tests/engine/test_arg_utils.py"
POOLING = "tests/models/language/pooling/test_embedding.py"
TWO = "tests/entrypoints/openai/test_two_models.py"
LORA_SERVING = "tests/entrypoints/openai/test_lora_serving.py"
LORA_ENGINE = "tests/lora/test_engine_api_engines.py"
LORA_MANAGER = "tests/lora/test_model_manager.py"
SPEC = "tests/v1/spec_decode/test_speculative_config.py"

SCHED = "tests/v1/core/test_scheduler.py"
CUDAGRAPH = "tests/v1/cudagraph/test_config_and_dispatch.py"
COMPILE = "tests/compile/test_compile_cpu.py"
MULTIPROC = "tests/distributed/test_multiproc_executor.py"
SO_VALIDATION = "tests/entrypoints/test_structured_outputs_validation.py"
CHAT_TOOLS = "tests/entrypoints/openai/test_chat_tools_server.py"
CHAT_PARSING = "tests/entrypoints/openai/test_chat_tools_parsing.py"
XGRAMMAR = "tests/v1/structured_output/test_backend_xgrammar.py"
SO_REASONING = "tests/v1/structured_output/test_reasoning_structured_output.py"
SO_ENGINE_REASONING = "tests/v1/structured_output/test_engine_reasoning_structured_output.py"

AUDIT: dict[str, tuple[str, Any]] = {
    # ---- front end (cli_args.py) ----
    "model_tag": ("tested", f"{SERVING}::test_models_and_meta"),
    "host": ("tested", f"{SERVING}::test_models_and_meta"),
    "port": ("tested", f"{SERVING}::test_models_and_meta"),
    "api_server_count": (
        "tested",
        "tests/entrypoints/openai/test_api_server_count.py::test_both_servers_answer_a_concurrent_load",
    ),
    "headless": (
        "tested",
        "tests/v1/distributed/test_multinode_mp.py::test_headless_secondary_serves_dp_rank_1",
    ),
    "uvicorn_log_level": (
        "tested",
        (f"{FRONTEND}::test_uvicorn_log_level_trace_logs_asgi_messages"),
    ),
    "disable_uvicorn_access_log": (
        "tested",
        (f"{FRONTEND}::test_access_log_is_on_by_default_and_off_with_the_flag"),
    ),
    "allowed_origins": ("tested", f"{FRONTEND}::test_cors_flags"),
    "allow_credentials": ("tested", f"{FRONTEND}::test_cors_flags"),
    "allowed_methods": ("tested", f"{FRONTEND}::test_cors_flags"),
    "allowed_headers": ("tested", f"{FRONTEND}::test_cors_flags"),
    "api_key": ("tested", f"{AUTH}::test_keys_are_checked"),
    "chat_template": ("tested", f"{FRONTEND}::test_chat_template_flags"),
    "trust_request_chat_template": ("tested", f"{FRONTEND}::test_chat_template_flags"),
    "response_role": ("tested", f"{FRONTEND}::test_response_role"),
    "enable_auto_tool_choice": ("tested", f"{CHAT_TOOLS}::test_auto_tool_call_streamed_and_not"),
    "tool_call_parser": ("tested", f"{CHAT_TOOLS}::test_bad_parser_flags_refuse_to_start"),
    "tool_parser_plugin": ("tested", f"{CHAT_PARSING}::test_tool_parser_plugin"),
    "exclude_tools_when_tool_choice_none": (
        "tested",
        f"{CHAT_TOOLS}::test_tool_history_and_exclude_tools_when_tool_choice_none",
    ),
    "reasoning_parser": ("tested", f"{CHAT_TOOLS}::test_reasoning_then_json_schema_content"),
    "reasoning_parser_plugin": ("tested", f"{CHAT_PARSING}::test_reasoning_parser_plugin"),
    "root_path": ("tested", f"{FRONTEND}::test_root_path"),
    "enable_force_include_usage": ("tested", f"{FRONTEND}::test_force_include_usage"),
    "enable_prompt_tokens_details": ("tested", f"{FRONTEND}::test_prompt_tokens_details"),
    "max_num_queued_reqs": ("tested", f"{AUTH}::test_queue_limit"),
    "shutdown_timeout": (
        "tested",
        ("tests/entrypoints/openai/test_shutdown.py::test_sigterm_lets_in_flight_requests_finish"),
    ),
    "disable_fastapi_docs": ("tested", f"{FRONTEND}::test_disable_fastapi_docs"),
    "disable_playground": (
        "tested",
        (
            "tests/entrypoints/test_playground.py::"
            "test_routes_serve_the_packaged_files_and_the_flag_removes_them"
        ),
    ),
    # Both forms parsed (and malformed entries refused) in-process; the server
    # serves them with outputs equal to peft's merged model.
    "lora_modules": ("tested", f"{LORA_SERVING}::test_adapter_outputs_equal_peft_merged_model"),
    "max_request_body_bytes": (
        "tested",
        (
            "tests/entrypoints/openai/test_hostile_inputs.py::"
            "test_declared_body_over_limit_is_refused_before_it_is_sent"
        ),
    ),
    # ---- the second, pooling engine of `vllm serve` (embedding_model.py) ----
    "embedding_model": ("tested", f"{TWO}::test_concurrent_chat_and_embeddings_match_references"),
    "embedding_served_model_name": ("tested", f"{TWO}::test_models_lists_both_with_tasks"),
    "embedding_dtype": ("tested", f"{TWO}::test_concurrent_chat_and_embeddings_match_references"),
    "embedding_max_model_len": ("tested", f"{TWO}::test_models_lists_both_with_tasks"),
    "embedding_max_num_seqs": ("tested", f"{TWO}::test_embedding_engine_args"),
    "embedding_kv_cache_memory_bytes": (
        "tested",
        f"{TWO}::test_decoder_embedder_own_budget_and_exit_on_death",
    ),
    # Works on a GPU; on CPU it is refused naming the flag (tested there).
    "embedding_gpu_memory_utilization": (
        "tested",
        f"{TWO}::test_embedding_gpu_fraction_refused_on_cpu",
    ),
    "embedding_pooler_config": (
        "tested",
        f"{TWO}::test_decoder_embedder_own_budget_and_exit_on_death",
    ),
    "embedding_chat_template": ("tested", f"{TWO}::test_embedding_messages_use_its_own_template"),
    # ---- ModelConfig ----
    "model": ("tested", f"{SERVING}::test_models_and_meta"),
    "served_model_name": ("tested", f"{FRONTEND}::test_served_model_names"),
    "tokenizer": ("tested", f"{EFFECTS}::test_tokenizer_flag_picks_the_tokenizer"),
    "tokenizer_mode": ("refused", "mistral"),
    "trust_remote_code": ("tested", f"{EFFECTS}::test_trust_remote_code"),
    "runner": ("tested", f"{POOLING}::test_qwen3_last_token_matches_sentence_transformers"),
    "convert": ("tested", f"{POOLING}::test_convert_embed_on_a_causal_lm"),
    "pooler_config": ("tested", f"{POOLING}::test_pooler_config_overrides_and_matryoshka"),
    "skip_tokenizer_init": ("tested", f"{EFFECTS}::test_skip_tokenizer_init"),
    "dtype": ("tested", f"{ARGS}::test_round_trip_to_engine_config"),
    "seed": ("tested", f"{EFFECTS}::test_engine_seed_drives_unseeded_sampling"),
    "max_model_len": (
        "tested",
        (f"{DEFAULTS}::test_max_model_len_defaults_to_the_config_and_is_capped_by_the_tokenizer"),
    ),
    "max_logprobs": ("tested", f"{EFFECTS}::test_max_logprobs_caps_requests"),
    "logprobs_mode": ("tested", "tests/samplers/test_logprobs_mode.py::test_processed_logprobs"),
    "revision": ("refused", "main"),
    "quantization": ("refused", "awq"),
    "enforce_eager": ("tested", f"{CUDAGRAPH}::test_resolution"),
    "generation_config": (
        "tested",
        (
            "tests/entrypoints/test_generation_config.py::"
            "test_generation_config_vllm_ignores_the_file"
        ),
    ),
    "enable_sleep_mode": (
        "tested",
        ("tests/entrypoints/openai/test_dev_mode.py::test_sleep_frees_memory_and_outputs_survive"),
    ),
    "hf_overrides": (
        "tested",
        (f"{DEFAULTS}::test_without_chunked_prefill_the_defaulted_budget_covers_max_model_len"),
    ),
    # ---- LoadConfig ----
    "load_format": (
        "tested",
        ("tests/model_executor/test_models.py::test_dummy_load_format_gives_random_weights"),
    ),
    "download_dir": ("refused", "/tmp/weights"),
    # ---- CacheConfig ----
    "block_size": ("tested", f"{EFFECTS}::test_block_size_and_hash_algo_reach_the_kv_cache"),
    "gpu_memory_utilization": ("refused", 0.5),  # on CPU; CUDA: tests/v1/cudagraph/
    "kv_cache_memory_bytes": (
        "tested",
        ("tests/v1/worker/test_gpu_worker.py::test_cpu_kv_cache_budget_sources"),
    ),
    "kv_cache_dtype": ("refused", "fp8"),
    "enable_prefix_caching": ("tested", (f"{SCHED}::test_prefix_cache_hit_across_requests")),
    "prefix_caching_hash_algo": (
        "tested",
        (f"{EFFECTS}::test_block_size_and_hash_algo_reach_the_kv_cache"),
    ),
    "num_gpu_blocks_override": (
        "tested",
        ("tests/models/test_model_zoo.py::test_mla_caches_only_the_compressed_latent"),
    ),
    # ---- SchedulerConfig ----
    "max_num_batched_tokens": (
        "tested",
        (f"{DEFAULTS}::test_llm_with_only_max_num_batched_tokens_runs_chunked"),
    ),
    "max_num_seqs": ("tested", f"{DEFAULTS}::test_user_values_are_never_changed"),
    "enable_chunked_prefill": (
        "tested",
        (f"{SCHED}::test_chunked_prefill_disabled_stops_at_a_prompt_that_does_not_fit"),
    ),
    "long_prefill_token_threshold": ("tested", (f"{SCHED}::test_long_prefill_token_threshold")),
    "scheduling_policy": (
        "tested",
        (f"{SCHED}::test_priority_preemption_victim_is_lowest_priority_latest_arrival"),
    ),
    "async_scheduling": (
        "tested",
        ("tests/v1/engine/test_batch_queue.py::test_two_steps_in_flight_same_tokens"),
    ),
    "stream_interval": (
        "tested",
        ("tests/v1/engine/test_output_processor.py::test_stream_interval_batches_delta_outputs"),
    ),
    # ---- ParallelConfig ----
    "tensor_parallel_size": ("tested", (f"{MULTIPROC}::test_greedy_parity_with_one_worker")),
    "pipeline_parallel_size": ("tested", (f"{MULTIPROC}::test_greedy_parity_with_one_worker")),
    "data_parallel_size": (
        "tested",
        "tests/v1/distributed/test_dp_serve.py::test_dp2_greedy_equals_single_engine_and_spreads",
    ),
    "data_parallel_rank": ("refused", 1),
    "data_parallel_start_rank": ("refused", 1),
    "data_parallel_size_local": ("refused", 2),
    "data_parallel_address": ("refused", "tcp://127.0.0.1"),
    "data_parallel_rpc_port": ("refused", 0),
    "data_parallel_backend": (
        "tested",
        "tests/v1/distributed/test_ray_dp_serve.py::test_dp2_tp2_ray_equals_single_engine_then_a_node_is_lost",
    ),
    "data_parallel_hybrid_lb": ("refused", True),
    "data_parallel_external_lb": ("refused", True),
    "enable_expert_parallel": (
        "tested",
        (
            "tests/distributed/test_expert_parallel.py"
            "::test_tp2_expert_parallel_greedy_matches_single_engine"
        ),
    ),
    "expert_placement_strategy": ("refused", "random"),
    "all2all_backend": ("refused", "deepep_low_latency"),
    "distributed_executor_backend": ("tested", (f"{MULTIPROC}::test_backend_choice")),
    # ---- DeviceConfig / AttentionConfig ----
    "device": ("tested", f"{EFFECTS}::test_device_flag"),
    "attention_backend": (
        "tested",
        (
            "tests/kernels/test_attention_selector.py::"
            "test_attention_backend_flag_reaches_the_selector"
        ),
    ),
    # ---- JSON configs: the flag itself, then each field ----
    "compilation_config": (
        "tested",
        (f"{COMPILE}::test_compilation_config_flag_compiles_through_the_engine"),
    ),
    "compilation_config.mode": (
        "tested",
        (f"{COMPILE}::test_compilation_config_flag_compiles_through_the_engine"),
    ),
    "compilation_config.backend": (
        "tested",
        (f"{COMPILE}::test_compiled_matches_eager_without_recompiles"),
    ),
    "compilation_config.cudagraph_mode": ("tested", (f"{CUDAGRAPH}::test_cli_compilation_config")),
    "compilation_config.splitting_ops": (
        "tested",
        "tests/compile/test_piecewise_cpu.py::test_splitting_ops_through_the_engine",
    ),
    "compilation_config.cudagraph_capture_sizes": (
        "tested",
        "tests/v1/cudagraph/test_padding_cpu.py::test_v2_padded_forward_matches_unpadded",
    ),
    "compilation_config.max_cudagraph_capture_size": (
        "tested",
        (f"{CUDAGRAPH}::test_capture_sizes_default_and_clipping"),
    ),
    "structured_outputs_config": (
        "tested",
        (f"{SO_VALIDATION}::test_structured_outputs_config_flag"),
    ),
    "structured_outputs_config.backend": (
        "tested",
        ("tests/v1/structured_output/test_params.py::test_config_defaults_and_refused_backends"),
    ),
    "structured_outputs_config.disable_fallback": ("tested", f"{EFFECTS}::test_disable_fallback"),
    "structured_outputs_config.disable_any_whitespace": (
        "tested",
        (f"{XGRAMMAR}::test_config_disable_any_whitespace"),
    ),
    "structured_outputs_config.disable_additional_properties": (
        "tested",
        f"{EFFECTS}::test_disable_additional_properties",
    ),
    "structured_outputs_config.reasoning_parser": (
        "tested",
        f"{SO_ENGINE_REASONING}::test_content_after_the_reasoning_is_constrained",
    ),
    "structured_outputs_config.enable_in_reasoning": (
        "tested",
        f"{SO_REASONING}::test_enable_in_reasoning_constrains_the_reasoning_too",
    ),
    "structured_outputs_config.reasoning_parser_plugin": (
        "tested",
        f"{SO_REASONING}::test_parser_plugin_is_imported",
    ),
    "performance_mode": ("tested", f"{DEFAULTS}::test_throughput_mode_doubles_only_the_defaults"),
    # ---- SpeculativeConfig: validated as upstream; unbuilt methods refused by name ----
    "speculative_config": (
        "tested",
        "tests/v1/spec_decode/test_ngram_e2e.py::test_greedy_identical_and_drafts_accepted",
    ),
    "spec_method": ("tested", f"{SPEC}::test_spec_shorthands_merge_and_conflict"),
    "spec_model": ("tested", f"{SPEC}::test_spec_shorthands_merge_and_conflict"),
    "spec_tokens": ("tested", f"{SPEC}::test_spec_shorthands_merge_and_conflict"),
    # ---- LoRAConfig (each of the others is refused without --enable-lora) ----
    "enable_lora": ("tested", f"{LORA_ENGINE}::test_adapters_change_the_output_and_are_listed"),
    "max_loras": (
        "tested",
        (
            "tests/v1/core/test_scheduler_lora.py::"
            "test_every_step_within_max_loras_and_every_request_finishes"
        ),
    ),
    "max_lora_rank": (
        "tested",
        f"{LORA_ENGINE}::test_bad_adapter_raises_and_the_engine_keeps_serving",
    ),
    "max_cpu_loras": ("tested", f"{LORA_MANAGER}::test_max_cpu_loras_bounds_loaded_adapters"),
    "lora_dtype": ("tested", f"{LORA_ENGINE}::test_lora_dtype_and_max_lora_rank_reach_the_layers"),
    "lora_target_modules": (
        "tested",
        f"{LORA_MANAGER}::test_target_modules_restricts_wrapped_layers",
    ),
    "fully_sharded_loras": ("tested", "tests/lora/test_layers_tp.py::test_tp2_equals_tp1"),
    "specialize_active_lora": ("tested", "tests/lora/test_ops_triton.py::test_triton_lora_kernel"),
    # ---- observability / AsyncEngineArgs ----
    "disable_log_stats": ("tested", f"{EFFECTS}::test_log_stats_report_request_metrics"),
    "enable_log_requests": ("tested", f"{FRONTEND}::test_enable_log_requests"),
    "otlp_traces_endpoint": (
        "tested",
        "tests/tracing/test_tracing.py::test_span_carries_the_request_timings_and_the_callers_trace",
    ),
    "collect_detailed_traces": ("refused", ["model"]),
}

# Fields of the JSON-config flags, audited as "<flag>.<field>".
JSON_CONFIGS: dict[str, type] = {
    "compilation_config": CompilationConfig,
    "structured_outputs_config": StructuredOutputsConfig,
}
# Internal fields a user cannot set from the command line.
_NOT_USER_FIELDS = {"compilation_config.static_forward_context"}


@cache
def _serve_parser() -> argparse.ArgumentParser:
    return make_arg_parser(FlexibleArgumentParser())


def _flag_dests() -> set[str]:
    return {a.dest for a in _serve_parser()._actions if a.dest != "help"}


def _json_fields() -> set[str]:
    return {
        f"{flag}.{f.name}"
        for flag, cls in JSON_CONFIGS.items()
        for f in dataclasses.fields(cls)
        if f.init
    } - _NOT_USER_FIELDS


def _option_strings(dest: str) -> list[str]:
    for action in _serve_parser()._actions:
        if action.dest == dest:
            return list(action.option_strings)
    return []


def test_every_flag_and_json_field_is_audited():
    audited = set(AUDIT)
    expected = _flag_dests() | _json_fields()
    missing = sorted(expected - audited)
    stale = sorted(audited - expected)
    assert not missing, f"flags / JSON fields without an audit row: {missing}"
    assert not stale, f"audit rows for flags / fields that no longer exist: {stale}"


def test_engine_fields_are_all_serve_flags():
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert fields <= _flag_dests(), sorted(fields - _flag_dests())


@cache
def _test_functions(path: str) -> frozenset[str]:
    tree = ast.parse((REPO_ROOT / path).read_text())
    return frozenset(
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


@pytest.mark.parametrize("dest", sorted(d for d, (kind, _) in AUDIT.items() if kind == "tested"))
def test_tested_rows_name_an_existing_test(dest):
    path, _, name = AUDIT[dest][1].partition("::")
    assert (REPO_ROOT / path).is_file(), f"{dest}: no file {path}"
    assert name.startswith("test") and name in _test_functions(path), (
        f"{dest}: {path} has no test function {name!r}"
    )


def _refusal_error(dest: str, value: Any, model: str) -> Exception:
    """The error building the config (or validating the serve args) raises."""
    engine_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    flag, _, field = dest.partition(".")
    try:
        if field:
            EngineArgs(model=model, device="cpu", **{flag: {field: value}}).create_engine_config(
                UsageContext.OPENAI_API_SERVER
            )
        elif dest in engine_fields:
            AsyncEngineArgs(model=model, device="cpu", **{dest: value}).create_engine_config(
                UsageContext.OPENAI_API_SERVER
            )
        else:
            args = _serve_parser().parse_args([])
            setattr(args, dest, value)
            validate_parsed_serve_args(args)
    except (ValueError, TypeError, NotImplementedError) as e:
        return e
    pytest.fail(f"{dest}={value!r} was accepted; the audit says it is refused")


@pytest.mark.parametrize("dest", sorted(d for d, (kind, _) in AUDIT.items() if kind == "refused"))
def test_refused_rows_raise_an_error_naming_the_flag(dest, tiny_model_dir):
    error = _refusal_error(dest, AUDIT[dest][1], tiny_model_dir("llama"))
    message = str(error)
    names = [dest, *(_option_strings(dest) if "." not in dest else [])]
    assert any(name in message for name in names), (
        f"{dest}: the error does not name the flag ({names}): {message!r}"
    )


def test_every_kind_is_known():
    assert {kind for kind, _ in AUDIT.values()} <= {"tested", "refused"}
