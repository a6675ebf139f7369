"""Engine arguments: one flat dataclass, its CLI flags and the `VllmConfig` it builds.

Upstream: vllm/engine/arg_utils.py. Every field of `EngineArgs` is a flag
(`max_num_seqs` -> `--max-num-seqs`), generated from the field's metadata;
booleans use `BooleanOptionalAction` (`--enable-prefix-caching` /
`--no-enable-prefix-caching`). `create_engine_config` turns the flat fields
into the per-concern config dataclasses and fills the defaults that depend on
the hardware and on who started the engine (`UsageContext`).

`--structured-outputs-config` takes JSON: the dict is checked field by
field against `StructuredOutputsConfig` (an unknown field is an error).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Self, get_args

import torch

from vllm.config import (
    AttentionConfig,
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    LoadConfig,
    LoRAConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
    VllmConfig,
)
from vllm.config.compilation import PERFORMANCE_MODES, CompilationMode
from vllm.config.lora import LoRADType, MaxLoRARanks
from vllm.config.scheduler import SchedulerPolicy
from vllm.engine.arg_utils_parallel import create_parallel_config
from vllm.logger import init_logger
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import add_field_flag as _add_flag
from vllm.utils.argparse_utils import field_arg as _arg
from vllm.utils.argparse_utils import (
    human_readable_int,
    human_readable_int_or_auto,
    json_dict,
    optional_type,
)

logger = init_logger(__name__)

_GiB = 1 << 30


def _compilation_arg(value: str) -> dict[str, Any] | int:
    """`-cc 0` (a mode number) or `-cc '{"mode": 0, ...}'`."""
    return int(value) if value.strip().lstrip("-").isdigit() else json_dict(value)


_opt_str = optional_type(str)
_opt_int = optional_type(int)
_DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
# The LoRA flags other than --enable-lora, which they need (EngineArgs field
# -> LoRAConfig field).
_LORA_FIELDS: dict[str, str] = {
    "max_loras": "max_loras",
    "max_lora_rank": "max_lora_rank",
    "fully_sharded_loras": "fully_sharded_loras",
    "max_cpu_loras": "max_cpu_loras",
    "lora_dtype": "lora_dtype",
    "lora_target_modules": "target_modules",
    "specialize_active_lora": "specialize_active_lora",
}


@dataclass
class EngineArgs:
    """Arguments for the vLLM engine (the flat view of `VllmConfig`)."""

    # Set by `vllm serve --api-server-count N` on each API server's copy (as
    # upstream); not fields, so not flags.
    _api_process_count = 1
    _api_process_rank = 0

    # --- ModelConfig ---
    model: str = _arg(
        ModelConfig.model,
        "Path of the model: a Hugging Face model directory or "
        "a .gguf file. Default: the embedded SmolLM2-135M-Instruct.",
        "ModelConfig",
    )
    served_model_name: str | list[str] | None = _arg(
        None,
        "Name(s) the API serves the model under (default: the model path).",
        "ModelConfig",
        nargs="+",
    )
    tokenizer: str | None = _arg(
        None, "Tokenizer path (default: the model's).", "ModelConfig", type=_opt_str
    )
    tokenizer_mode: str = _arg(
        "auto",
        '"auto" uses the fast tokenizer when there is one; "slow" forces the Python one.',
        "ModelConfig",
    )
    trust_remote_code: bool = _arg(False, "Trust remote code from Hugging Face.", "ModelConfig")
    runner: str = _arg(
        "auto",
        "Runner type to use for the model.",
        "ModelConfig",
        choices=["auto", "generate", "pooling"],
    )
    skip_tokenizer_init: bool = _arg(
        False, "Skip tokenizer initialization; prompts must then be token ids.", "ModelConfig"
    )
    convert: str = _arg(
        "auto",
        "Convert the model with an adapter (pooling runner): embed, classify; "
        '"auto" picks one from the architecture name.',
        "ModelConfig",
        choices=["auto", "none", "embed", "classify", "reward"],
    )
    pooler_config: dict[str, Any] | None = _arg(
        None,
        "Pooling models: a JSON PoolerConfig, e.g. "
        '\'{"pooling_type": "MEAN", "use_activation": true}\' (fields: task, '
        "pooling_type, seq_pooling_type, tok_pooling_type, use_activation, dimensions, "
        "logit_mean, logit_sigma, step_tag_id, returned_token_ids).",
        "ModelConfig",
        type=json_dict,
    )
    dtype: str = _arg(
        "auto",
        'Data type of weights and activations. "auto": the checkpoint\'s '
        "(float16 checkpoints run in bfloat16 on CPU; everything runs in float32 on a CPU "
        "without native bf16, i.e. no avx512_bf16 / amx_bf16).",
        "ModelConfig",
        choices=_DTYPES,
    )
    seed: int = _arg(0, "Random seed.", "ModelConfig", type=int)
    max_model_len: int | None = _arg(
        None,
        "Model context length (prompt plus output). Accepts 1k/1K-style suffixes; -1 or "
        '"auto" picks the largest that fits the KV cache.',
        "ModelConfig",
        type=human_readable_int_or_auto,
    )
    max_logprobs: int = _arg(
        20,
        "Largest number of logprobs a request may ask for; -1 means the vocabulary size.",
        "ModelConfig",
        type=int,
    )
    logprobs_mode: str = _arg(
        "raw_logprobs",
        "What logprobs report.",
        "ModelConfig",
        choices=["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"],
    )
    revision: str | None = _arg(
        None,
        "Model revision (branch, tag or commit). Refused: models load from local paths only.",
        "ModelConfig",
        type=_opt_str,
    )
    quantization: str | None = _arg(
        None,
        "Quantization method of the weights; by default the checkpoint's "
        "quantization_config.quant_method. Built: compressed-tensors (W8A16, W4A16, "
        'W8A8 int8, FP8 on CPU), "fp8" (fp8 checkpoints, or -q fp8 on an unquantized '
        'one: weights quantized to fp8 at load), "gptq" and "awq" (4-bit, groups of '
        '32-256, on CPU) and "gguf" (a .gguf model); a value '
        "that contradicts the checkpoint, or another method, is refused.",
        "ModelConfig",
        type=_opt_str,
        aliases=("-q",),
    )
    enforce_eager: bool = _arg(
        False, "Always run the model eagerly (no CUDA graphs).", "ModelConfig"
    )
    generation_config: str = _arg(
        "auto",
        '"auto" takes default sampling parameters from the '
        'model\'s generation_config.json; "vllm" ignores it; a '
        "folder path loads it from there.",
        "ModelConfig",
    )
    hf_overrides: dict[str, Any] | None = _arg(
        None, "JSON object merged into the Hugging Face config.", "ModelConfig", type=json_dict
    )
    enable_sleep_mode: bool = _arg(
        False,
        "Allow sleep / wake_up (LLM.sleep, POST /sleep under "
        "VLLM_SERVER_DEV_MODE=1): level 1 frees the KV cache, "
        "level 2 the weights too.",
        "ModelConfig",
    )
    # --- LoadConfig ---
    load_format: str = _arg(
        "auto",
        "Weight format: auto, safetensors, pt, gguf or dummy (random weights).",
        "LoadConfig",
    )
    download_dir: str | None = _arg(
        None,
        "Directory for downloaded weights. Refused: nothing is downloaded (local paths only).",
        "LoadConfig",
        type=_opt_str,
    )
    # --- CacheConfig ---
    block_size: int | None = _arg(
        None, "Tokens per KV-cache block (default 16).", "CacheConfig", type=_opt_int
    )
    gpu_memory_utilization: float = _arg(
        0.92,
        "Fraction of GPU memory the engine may use "
        "(weights, activations and KV cache). GPUs only: "
        "another value is refused on CPU.",
        "CacheConfig",
        type=float,
    )
    kv_cache_memory_bytes: int | None = _arg(
        None,
        "KV-cache size in bytes (1G-style suffixes accepted); overrides "
        "--gpu-memory-utilization and, on CPU, VLLM_CPU_KVCACHE_SPACE.",
        "CacheConfig",
        type=optional_type(human_readable_int),
    )
    kv_cache_dtype: str = _arg(
        "auto", 'KV-cache data type ("auto": the model dtype).', "CacheConfig"
    )
    enable_prefix_caching: bool | None = _arg(
        None,
        "Reuse the KV cache of shared prompt "
        "prefixes (default: on, except for hybrid and "
        "attention-free models).",
        "CacheConfig",
    )
    prefix_caching_hash_algo: str = _arg(
        "sha256",
        "Hash of prefix-cache blocks.",
        "CacheConfig",
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
    )
    num_gpu_blocks_override: int | None = _arg(
        None,
        "Use this many KV-cache blocks, whatever the memory says.",
        "CacheConfig",
        type=_opt_int,
    )
    # --- SchedulerConfig ---
    max_num_batched_tokens: int | None = _arg(
        None,
        "Token budget of one engine step (default: by hardware and entry point).",
        "SchedulerConfig",
        type=optional_type(human_readable_int),
    )
    max_num_seqs: int | None = _arg(
        None,
        "Most requests in one engine step (default: by "
        "hardware and entry point, at most "
        "--max-num-batched-tokens).",
        "SchedulerConfig",
        type=_opt_int,
    )
    enable_chunked_prefill: bool | None = _arg(
        None, "Split long prompts over several steps (default: on).", "SchedulerConfig"
    )
    long_prefill_token_threshold: int = _arg(
        0, "A prompt chunk longer than this is cut to it (0: no cap).", "SchedulerConfig", type=int
    )
    scheduling_policy: SchedulerPolicy = _arg(
        "fcfs", "Order of the waiting queue.", "SchedulerConfig", choices=["fcfs", "priority"]
    )
    async_scheduling: bool | None = _arg(
        None, "Schedule step N+1 while step N runs.", "SchedulerConfig"
    )
    stream_interval: int = _arg(
        1, "Tokens between two streamed outputs of a request.", "SchedulerConfig", type=int
    )
    # --- ParallelConfig ---
    tensor_parallel_size: int = _arg(
        1, "Tensor-parallel ranks.", "ParallelConfig", type=int, aliases=("-tp",)
    )
    pipeline_parallel_size: int = _arg(
        1, "Pipeline stages.", "ParallelConfig", type=int, aliases=("-pp",)
    )
    data_parallel_size: int = _arg(
        1,
        "Data-parallel engine cores (each with its own workers and KV cache); the "
        "front end balances requests over them.",
        "ParallelConfig",
        type=int,
        aliases=("-dp",),
    )
    data_parallel_rank: int | None = _arg(
        None,
        "This instance's DP rank, for external load balancing (not built yet).",
        "ParallelConfig",
        type=_opt_int,
        aliases=("-dpn",),
    )
    data_parallel_start_rank: int | None = _arg(
        None,
        "DP rank of the first engine on this node (secondary nodes, with --headless).",
        "ParallelConfig",
        type=_opt_int,
        aliases=("-dpr",),
    )
    data_parallel_size_local: int | None = _arg(
        None,
        "DP engines on this node (default: all of --data-parallel-size).",
        "ParallelConfig",
        type=_opt_int,
        aliases=("-dpl",),
    )
    data_parallel_address: str | None = _arg(
        None,
        "Address of the DP head node (coordinator, handshake, DP group).",
        "ParallelConfig",
        type=_opt_str,
        aliases=("-dpa",),
    )
    data_parallel_rpc_port: int | None = _arg(
        None,
        "Port of the DP head node's start-up handshake with remote engines (default 29550).",
        "ParallelConfig",
        type=_opt_int,
        aliases=("-dpp",),
    )
    data_parallel_backend: str = _arg(
        "mp",
        "How DP engines are started: mp (local processes) or ray (Ray actors).",
        "ParallelConfig",
        choices=["mp", "ray"],
        aliases=("-dpb",),
    )
    data_parallel_hybrid_lb: bool = _arg(
        False,
        "Hybrid DP load balancing: one API server per node over its local engines (not built yet).",
        "ParallelConfig",
        aliases=("-dph",),
    )
    data_parallel_external_lb: bool = _arg(
        False,
        "External DP load balancing: one API server per DP rank (not built yet).",
        "ParallelConfig",
        aliases=("-dpe",),
    )
    enable_expert_parallel: bool = _arg(
        False,
        "Shard MoE experts over the TP x DP ranks instead of tensor-parallel splits.",
        "ParallelConfig",
        aliases=("-ep",),
    )
    expert_placement_strategy: str = _arg(
        "linear",
        "Expert placement over the EP ranks: linear (contiguous blocks) or round_robin.",
        "ParallelConfig",
        choices=["linear", "round_robin"],
    )
    all2all_backend: str = _arg(
        "allgather_reducescatter",
        "All-to-all backend of expert parallelism (only allgather_reducescatter is built).",
        "ParallelConfig",
    )
    distributed_executor_backend: str | None = _arg(
        None,
        "Executor: uni, mp, ray or external_launcher (default: by world size).",
        "ParallelConfig",
        type=_opt_str,
    )
    # --- DeviceConfig ---
    device: str = _arg(
        "auto", "Device: auto, cpu or cuda.", "DeviceConfig", choices=["auto", "cpu", "cuda"]
    )
    # --- CompilationConfig ---
    compilation_config: dict[str, Any] | int | None = _arg(
        None,
        "Compilation settings: a mode number or a JSON object.",
        "CompilationConfig",
        type=_compilation_arg,
        aliases=("-cc",),
    )
    # --- AttentionConfig ---
    attention_backend: str | None = _arg(
        None,
        "Attention backend (CPU_ATTN, TRITON_ATTN, FLASHINFER); default: the platform's "
        "choice, or VLLM_ATTENTION_BACKEND.",
        "AttentionConfig",
        type=_opt_str,
    )
    # --- StructuredOutputsConfig ---
    structured_outputs_config: dict[str, Any] | StructuredOutputsConfig | None = _arg(
        None,
        'Structured-output settings as a JSON object, e.g. \'{"backend": '
        '"xgrammar", "disable_any_whitespace": true}\' (backends: auto, xgrammar).',
        "StructuredOutputsConfig",
        type=json_dict,
    )
    reasoning_parser: str = _arg(
        "",
        "Split a thinking model's output into `reasoning` and `content` with "
        "this parser (deepseek_r1, qwen3, granite, mistral, or a plugin's); "
        "structured outputs then constrain only the content. Sets "
        "structured_outputs_config.reasoning_parser.",
        "StructuredOutputsConfig",
        type=str,
    )
    reasoning_parser_plugin: str = _arg(
        "",
        "A Python file that registers more reasoning parsers "
        "(@ReasoningParserManager.register_module(name)).",
        "StructuredOutputsConfig",
        type=str,
    )
    performance_mode: str = _arg(
        "balanced",
        '"throughput" doubles the defaulted --max-num-batched-tokens and '
        '--max-num-seqs; "interactivity" captures a CUDA graph for every batch size up to '
        "32 (when --compilation-config gives no capture sizes).",
        "VllmConfig",
        choices=list(PERFORMANCE_MODES),
    )
    # --- SpeculativeConfig (validated, then refused: not built yet) ---
    speculative_config: dict[str, Any] | None = _arg(
        None,
        'Speculative decoding as a JSON SpeculativeConfig, e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 3, "prompt_lookup_max": 4}\'. Validated as upstream, '
        "then refused: speculative decoding is not built yet.",
        "VllmConfig",
        type=json_dict,
        aliases=("-sc",),
    )
    spec_method: str | None = _arg(
        None, "Shorthand for --speculative-config's method.", "VllmConfig", type=_opt_str
    )
    spec_model: str | None = _arg(
        None, "Shorthand for --speculative-config's model.", "VllmConfig", type=_opt_str
    )
    spec_tokens: int | None = _arg(
        None,
        "Shorthand for --speculative-config's num_speculative_tokens.",
        "VllmConfig",
        type=_opt_int,
    )
    # --- LoRAConfig ---
    enable_lora: bool = _arg(False, "If True, enable handling of LoRA adapters.", "LoRAConfig")
    max_loras: int = _arg(
        LoRAConfig.max_loras,
        "Max number of distinct LoRA adapters in one engine step (GPU slots).",
        "LoRAConfig",
        type=int,
    )
    max_lora_rank: MaxLoRARanks = _arg(
        LoRAConfig.max_lora_rank,
        "Max LoRA rank: an adapter with a larger rank is refused when it is loaded.",
        "LoRAConfig",
        type=int,
        choices=list(get_args(MaxLoRARanks)),
    )
    fully_sharded_loras: bool = _arg(
        LoRAConfig.fully_sharded_loras,
        "Shard both LoRA matrices with tensor parallelism (not built: refused with "
        "tensor_parallel_size > 1, where it would change the layout).",
        "LoRAConfig",
    )
    max_cpu_loras: int | None = _arg(
        LoRAConfig.max_cpu_loras,
        "Max number of LoRA adapters kept in CPU memory; must be >= --max-loras "
        "(default: --max-loras).",
        "LoRAConfig",
        type=_opt_int,
    )
    lora_dtype: str | torch.dtype = _arg(
        LoRAConfig.lora_dtype,
        'Data type of the LoRA weights; "auto": the base model\'s dtype.',
        "LoRAConfig",
        choices=list(get_args(LoRADType)),
    )
    lora_target_modules: list[str] | None = _arg(
        LoRAConfig.target_modules,
        "Apply LoRA only to modules with these name suffixes (e.g. o_proj qkv_proj); "
        "default: every module the model supports.",
        "LoRAConfig",
        type=str,
        nargs="+",
    )
    specialize_active_lora: bool = _arg(
        LoRAConfig.specialize_active_lora,
        "GPU: size the LoRA kernels' launch grid by the number of adapters active in "
        "the step instead of --max-loras.",
        "LoRAConfig",
    )
    # --- Observability ---
    disable_log_stats: bool = _arg(False, "Do not log engine statistics.", "ObservabilityConfig")
    otlp_traces_endpoint: str | None = _arg(
        ObservabilityConfig.otlp_traces_endpoint,
        "Target URL to which OpenTelemetry traces are sent (one span per request; "
        "needs vllm[otel]).",
        "ObservabilityConfig",
        type=_opt_str,
    )
    collect_detailed_traces: list[str] | None = _arg(
        ObservabilityConfig.collect_detailed_traces,
        "Upstream's detailed (model / worker) traces: not built here, refused.",
        "ObservabilityConfig",
        type=str,
        nargs="+",
    )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one `--kebab-case` flag per field, grouped by config class."""
        groups: dict[str, Any] = {}
        for f in dataclasses.fields(EngineArgs):
            meta = f.metadata
            group = groups.get(meta["group"])
            if group is None:
                group = groups[meta["group"]] = parser.add_argument_group(meta["group"])
            _add_flag(group, f, meta)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> Self:
        """Build from parsed args, taking every attribute that names a field."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})

    def create_model_config(self) -> ModelConfig:
        return ModelConfig(
            model=self.model,
            tokenizer=self.tokenizer,
            tokenizer_mode=self.tokenizer_mode,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            seed=self.seed,
            revision=self.revision,
            max_model_len=-1 if self.max_model_len is None else self.max_model_len,
            max_logprobs=self.max_logprobs,
            logprobs_mode=self.logprobs_mode,
            enforce_eager=self.enforce_eager,
            served_model_name=self.served_model_name,
            quantization=self.quantization,
            skip_tokenizer_init=self.skip_tokenizer_init,
            generation_config=self.generation_config,
            runner=self.runner,
            convert=self.convert,
            pooler_config=self.pooler_config,  # type: ignore[arg-type]  # dict -> PoolerConfig
            hf_overrides=self.hf_overrides,
            enable_sleep_mode=self.enable_sleep_mode,
        )

    def create_engine_config(
        self, usage_context: UsageContext | None = None, headless: bool = False
    ) -> VllmConfig:
        """Resolve the defaults and build the `VllmConfig` the engine runs with.

        As upstream, the defaults that depend on the model and on who started
        the engine are written back into these fields first
        (`_set_default_chunked_prefill_and_prefix_caching_args`, then
        `_set_default_max_num_seqs_and_batched_tokens_args`), so a second call
        resolves to the same config.
        """
        device_config = DeviceConfig(device=self.device)
        model_config = self.create_model_config()
        self._check_feature_supported(model_config)
        self._set_default_chunked_prefill_and_prefix_caching_args(model_config)
        self._set_default_max_num_seqs_and_batched_tokens_args(
            usage_context, model_config, device_config
        )
        parallel_config = create_parallel_config(self, model_config, device_config, headless)
        assert self.enable_prefix_caching is not None
        cache_config = CacheConfig(
            block_size=16 if self.block_size is None else self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            cache_dtype=self.kv_cache_dtype,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
        )
        speculative_config = self.create_speculative_config(model_config, parallel_config)
        return VllmConfig(
            model_config=model_config,
            cache_config=cache_config,
            scheduler_config=self._create_scheduler_config(model_config),
            parallel_config=parallel_config,
            device_config=device_config,
            load_config=LoadConfig(load_format=self.load_format, download_dir=self.download_dir),
            compilation_config=self._create_compilation_config(),
            attention_config=AttentionConfig(backend=self.attention_backend),
            structured_outputs_config=self._create_structured_outputs_config(),
            lora_config=self._create_lora_config(),
            speculative_config=speculative_config,
            observability_config=ObservabilityConfig(
                otlp_traces_endpoint=self.otlp_traces_endpoint,
                collect_detailed_traces=self.collect_detailed_traces,  # type: ignore[arg-type]
            ),
        )

    def _check_feature_supported(self, model_config: ModelConfig) -> None:
        """Refuse flag values this build accepts on the command line but cannot
        honour here (the per-config ones are refused by the configs themselves)."""
        if (
            self.gpu_memory_utilization != EngineArgs.gpu_memory_utilization
            and DeviceConfig(device=self.device).device_type == "cpu"
        ):
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} has no effect on CPU "
                "(--gpu-memory-utilization sizes GPU memory only); size the KV cache with "
                "--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE instead."
            )

    def _set_default_chunked_prefill_and_prefix_caching_args(
        self, model_config: ModelConfig
    ) -> None:
        """Chunked prefill and prefix caching default to what the model supports
        (upstream: `ModelConfig.is_chunked_prefill_supported` /
        `is_prefix_caching_supported`); explicit values are kept."""
        if self.enable_chunked_prefill is None:
            self.enable_chunked_prefill = model_config.is_chunked_prefill_supported
            logger.debug(
                "%s chunked prefill by default",
                "Enabling" if self.enable_chunked_prefill else "Disabling",
            )
        if self.enable_prefix_caching is None:
            self.enable_prefix_caching = model_config.is_prefix_caching_supported
            logger.debug(
                "%s prefix caching by default",
                "Enabling" if self.enable_prefix_caching else "Disabling",
            )

    def _set_default_max_num_seqs_and_batched_tokens_args(
        self,
        usage_context: UsageContext | None,
        model_config: ModelConfig,
        device_config: DeviceConfig,
    ) -> None:
        """The step's token and request budgets, as upstream.

        Unset values come from `get_batch_defaults` (by device and entry
        point). A defaulted token budget grows to max_model_len without
        chunked prefill (a whole prompt must fit in one step) and never exceeds
        max_num_seqs * max_model_len; a defaulted max_num_seqs is capped at the
        token budget, so `LLM(model, max_num_batched_tokens=4)` runs with 4.
        Values the user set are never changed.
        """
        world_size = self.pipeline_parallel_size * self.tensor_parallel_size
        default_tokens, default_seqs = get_batch_defaults(device_config.device_type, world_size)
        user_tokens, user_seqs = self.max_num_batched_tokens, self.max_num_seqs
        if user_tokens is None:
            self.max_num_batched_tokens = default_tokens.get(
                usage_context, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
            )
        if user_seqs is None:
            self.max_num_seqs = default_seqs.get(
                usage_context, SchedulerConfig.DEFAULT_MAX_NUM_SEQS
            )
        assert self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        if self.performance_mode == "throughput":
            # Twice the defaults (never the user's values), before the caps below.
            if user_tokens is None:
                self.max_num_batched_tokens *= 2
            if user_seqs is None:
                self.max_num_seqs *= 2
        if user_tokens is None:
            if not self.enable_chunked_prefill:
                self.max_num_batched_tokens = max(
                    model_config.max_model_len, self.max_num_batched_tokens
                )
            self.max_num_batched_tokens = min(
                self.max_num_seqs * model_config.max_model_len, self.max_num_batched_tokens
            )
            logger.debug(
                "Defaulting max_num_batched_tokens to %d for %s usage context.",
                self.max_num_batched_tokens,
                usage_context.value if usage_context else None,
            )
        if user_seqs is None:
            self.max_num_seqs = min(self.max_num_seqs, self.max_num_batched_tokens)
            logger.debug(
                "Defaulting max_num_seqs to %d for %s usage context.",
                self.max_num_seqs,
                usage_context.value if usage_context else None,
            )

    def _create_scheduler_config(self, model_config: ModelConfig) -> SchedulerConfig:
        assert self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        assert self.enable_chunked_prefill is not None
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=model_config.max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            async_scheduling=self.async_scheduling,
            stream_interval=self.stream_interval,
        )

    def _create_compilation_config(self) -> CompilationConfig:
        if self.performance_mode not in PERFORMANCE_MODES:
            raise ValueError(
                f"performance_mode={self.performance_mode!r} (--performance-mode) "
                f"must be one of {PERFORMANCE_MODES}."
            )
        if self.performance_mode != "balanced":
            logger.info("Performance mode set to %r.", self.performance_mode)
        config = self._compilation_config_from_arg()
        config.performance_mode = self.performance_mode
        return config

    def _compilation_config_from_arg(self) -> CompilationConfig:
        cc = self.compilation_config
        if cc is None:
            return CompilationConfig()
        if isinstance(cc, int):
            return CompilationConfig(mode=CompilationMode(cc))
        known = {f.name for f in dataclasses.fields(CompilationConfig) if f.init}
        unknown = sorted(set(cc) - known - {"static_forward_context"})
        if unknown:
            raise ValueError(
                f"Unknown compilation_config key(s) {unknown}; "
                f"known: {sorted(known - {'static_forward_context'})}."
            )
        return CompilationConfig(**cc)

    def _create_lora_config(self) -> LoRAConfig | None:
        """The LoRAConfig with --enable-lora, else None. A LoRA flag set
        without --enable-lora would do nothing: refused, naming it."""
        if not self.enable_lora:
            for name in _LORA_FIELDS:
                value, default = getattr(self, name), getattr(EngineArgs, name)
                if value != default:
                    flag = "--" + name.replace("_", "-")
                    raise ValueError(
                        f"{name}={value!r} ({flag}) takes effect only with --enable-lora "
                        "(enable_lora=True)."
                    )
            return None
        kwargs = {field: getattr(self, name) for name, field in _LORA_FIELDS.items()}
        # As upstream: a max_cpu_loras of 0 or less means "default" (max_loras).
        if not (self.max_cpu_loras and self.max_cpu_loras > 0):
            kwargs["max_cpu_loras"] = None
        return LoRAConfig(**kwargs)

    def create_speculative_config(
        self, target_model_config: ModelConfig, target_parallel_config: ParallelConfig
    ) -> SpeculativeConfig | None:
        """`--speculative-config` merged with `--spec-method/--spec-model/
        --spec-tokens` (a key given both ways is an error), as a validated
        SpeculativeConfig for this target; None when neither is given."""
        spec = dict(self.speculative_config) if self.speculative_config is not None else None
        for flag, key, value in (
            ("--spec-method", "method", self.spec_method),
            ("--spec-model", "model", self.spec_model),
            ("--spec-tokens", "num_speculative_tokens", self.spec_tokens),
        ):
            if value is None:
                continue
            spec = {} if spec is None else spec
            if key in spec:
                raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
            spec[key] = value
        if spec is None:
            return None
        spec = {k.replace("-", "_"): v for k, v in spec.items()}
        engine_given = {"target_model_config", "target_parallel_config"}
        known = {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init} - engine_given
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(
                f"Unknown speculative_config key(s) {unknown} (--speculative-config); "
                f"known: {sorted(known)}."
            )
        return SpeculativeConfig(
            **spec,
            target_model_config=target_model_config,
            target_parallel_config=target_parallel_config,
        )

    def _create_structured_outputs_config(self) -> StructuredOutputsConfig:
        so = self.structured_outputs_config
        # As upstream: the flags win over the JSON config.
        for name in ("reasoning_parser", "reasoning_parser_plugin"):
            if getattr(self, name):
                so = {**_structured_outputs_dict(so), name: getattr(self, name)}
        if so is None:
            return StructuredOutputsConfig()
        if isinstance(so, StructuredOutputsConfig):
            return so
        if not isinstance(so, dict):
            raise TypeError(
                "structured_outputs_config must be a dict or a "
                f"StructuredOutputsConfig, got {type(so).__name__}"
            )
        known = {f.name for f in dataclasses.fields(StructuredOutputsConfig) if f.init}
        unknown = sorted(set(so) - known)
        if unknown:
            raise ValueError(
                f"Unknown structured_outputs_config key(s) {unknown}; known: {sorted(known)}."
            )
        return StructuredOutputsConfig(**so)


def _structured_outputs_dict(so: dict[str, Any] | StructuredOutputsConfig | None) -> Any:
    """The JSON-config form of `so` (to add a flag's value to it)."""
    if isinstance(so, StructuredOutputsConfig):
        return dataclasses.asdict(so)
    return so or {}


def get_batch_defaults(
    device_type: str, world_size: int
) -> tuple[dict[UsageContext | None, int], dict[UsageContext | None, int]]:
    """Default (max_num_batched_tokens, max_num_seqs) per entry point, as upstream.

    CPU: 4096 (LLM) / 2048 (server) tokens and 256 / 128 seqs, times the world
    size. GPUs: by memory size, larger budgets on 70+ GiB parts (A100 excepted).
    """
    llm, server = UsageContext.LLM_CLASS, UsageContext.OPENAI_API_SERVER
    if device_type == "cpu":
        return (
            {llm: 4096 * world_size, server: 2048 * world_size},
            {llm: 256 * world_size, server: 128 * world_size},
        )
    memory, name = _device_memory_and_name()
    if memory >= 160 * _GiB:
        return {llm: 16384, server: 16384}, {llm: 1024, server: 1024}
    if memory >= 70 * _GiB and "a100" not in name:
        return {llm: 16384, server: 8192}, {llm: 1024, server: 1024}
    return {llm: 8192, server: 2048}, {llm: 256, server: 256}


def _device_memory_and_name() -> tuple[int, str]:
    try:
        import torch

        props = torch.cuda.get_device_properties(0)
        return props.total_memory, props.name.lower()
    except Exception:
        # No usable device here (e.g. config built on a head node): use the
        # small-GPU defaults, as upstream does.
        return 0, ""


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Arguments for the asynchronous engine (the server's `AsyncLLM`)."""

    enable_log_requests: bool = _arg(
        False, "Log each request (id, parameters; prompts at DEBUG).", "Frontend"
    )

    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser, async_args_only: bool = False
    ) -> argparse.ArgumentParser:
        if not async_args_only:
            EngineArgs.add_cli_args(parser)
        f = next(f for f in dataclasses.fields(AsyncEngineArgs) if f.name == "enable_log_requests")
        _add_flag(parser, f, f.metadata)
        return parser
