"""Model configuration (upstream: vllm/config/model.py)."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from transformers import PretrainedConfig

from vllm.config.pooler import SEQ_POOLING_TYPES, PoolerConfig
from vllm.logger import init_logger
from vllm.tasks import POOLING_TASKS, PoolingTask
from vllm.transformers_utils.config import (
    embedded_model_path,
    get_config,
    get_pooling_config,
    get_sentence_transformer_tokenizer_config,
    is_gguf,
    try_get_generation_config,
)
from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE

if TYPE_CHECKING:
    from vllm.config.parallel import ParallelConfig
    from vllm.model_executor.models.registry import _ModelInfo

logger = init_logger(__name__)

RunnerType = Literal["generate", "pooling"]
ConvertType = Literal["none", "embed", "classify", "reward"]
_CONVERT_OPTIONS = ("auto", "none", "embed", "classify", "reward")

# Architecture-name suffix -> (runner, convert) defaults, as upstream; earlier
# entries win ("Model" last so that other *Model suffixes take priority).
_SUFFIX_TO_DEFAULTS: list[tuple[str, tuple[RunnerType, ConvertType]]] = [
    ("ForCausalLM", ("generate", "none")),
    ("ForConditionalGeneration", ("generate", "none")),
    ("ChatModel", ("generate", "none")),
    ("LMHeadModel", ("generate", "none")),
    ("ForTextEncoding", ("pooling", "embed")),
    ("EmbeddingModel", ("pooling", "embed")),
    ("ForSequenceClassification", ("pooling", "classify")),
    ("ClassificationModel", ("pooling", "classify")),
    ("ForRewardModeling", ("pooling", "reward")),
    ("RewardModel", ("pooling", "reward")),
    ("Model", ("pooling", "embed")),
]


def try_match_architecture_defaults(
    architecture: str, *, runner_type: str | None = None
) -> tuple[str, tuple[RunnerType, ConvertType]] | None:
    for suffix, (default_runner, default_convert) in _SUFFIX_TO_DEFAULTS:
        if (runner_type is None or runner_type == default_runner) and architecture.endswith(suffix):
            return suffix, (default_runner, default_convert)
    return None


# Keys of HF configs that bound the context length, in upstream's order.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# generation_config.json keys that become default sampling parameters.
_GEN_CONFIG_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
# --tokenizer-mode values built here ("hf" is upstream's name for the
# Hugging Face tokenizer, which "auto" also picks for every model we load).
_TOKENIZER_MODES = ("auto", "hf", "slow")
# HF keys that count experts; the first non-zero one makes a model MoE.
_NUM_EXPERTS_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


def _tokenizer_model_max_length(tokenizer: str | None) -> int | None:
    """model_max_length from a local tokenizer_config.json (None when absent or
    one of transformers' "unbounded" sentinels, ~1e30)."""
    if not tokenizer or not os.path.isdir(tokenizer):
        return None
    path = os.path.join(tokenizer, "tokenizer_config.json")
    try:
        with open(path) as f:
            value = json.load(f).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, (int, float)) and 0 < value < 1e12:
        return int(value)
    return None


def _resolve_auto_dtype(config_dtype: torch.dtype | None) -> torch.dtype:
    """dtype="auto": the checkpoint's dtype, except that float32 (or unknown,
    e.g. GGUF) checkpoints run in bfloat16 as upstream does, and float16 becomes
    bfloat16 on CPU where half precision matmuls are slow. On a CPU without
    native bf16 (no AVX512_BF16 / AMX-BF16) everything runs in float32: there
    bf16 GEMMs convert in software and take minutes where float32 takes
    seconds (issue 21); an explicit dtype still wins."""
    auto = torch.bfloat16 if config_dtype in (None, torch.float32) else config_dtype
    if torch.cuda.is_available():
        return auto
    from vllm.platforms import cpu_capability

    if not cpu_capability.cpu_has_native_bf16():
        logger.info_once(
            "dtype='auto': this CPU has no native bf16 (no avx512_bf16 / amx_bf16 flag in "
            "/proc/cpuinfo), so bf16 matmuls run in software (minutes where float32 takes "
            "~30 s on a 2-core AVX2 machine); computing in torch.float32 (checkpoint: %s). "
            "Pass --dtype bfloat16 to force bf16.",
            config_dtype if config_dtype is not None else "unknown dtype",
        )
        return torch.float32
    return torch.bfloat16 if auto == torch.float16 else auto


def _parse_max_model_len(value: int | str | None) -> int | None:
    """Accepts 4096, "4096", "32k", "1m" (k = 1000, K = 1024, as upstream), and None."""
    if value is None or isinstance(value, int):
        return value
    s = value.strip()
    mult = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}.get(s[-1:], 1)
    return int(float(s[:-1] if mult != 1 else s) * mult)


@dataclass
class ModelConfig:
    """Which model to run and how; derived fields are read from its config."""

    model: str = ""  # local HF directory or .gguf file; "" = the embedded default
    tokenizer: str | None = None
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    dtype: str | torch.dtype = "auto"
    seed: int = 0
    revision: str | None = None
    # Context length (prompt plus output); an int once constructed. -1 (or
    # None): derived from the checkpoint; "32k"-style strings are parsed, as by
    # upstream's validator (_parse_max_model_len).
    max_model_len: int = -1
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"
    enforce_eager: bool = False
    served_model_name: str | list[str] | None = None
    quantization: str | None = None
    skip_tokenizer_init: bool = False
    generation_config: str = "auto"
    runner: str = "auto"
    # Pooling models: how a model class without a pooler becomes one
    # (--convert; "auto": from the architecture name, as upstream).
    convert: str = "auto"
    # Pooling models: --pooler-config (a PoolerConfig; a dict or a JSON string
    # is converted in __post_init__); fields left None come from a
    # sentence-transformers dir, then the model. Resolved: a PoolerConfig
    # whenever runner_type == "pooling", else None.
    pooler_config: PoolerConfig | None = None
    hf_overrides: dict[str, Any] | None = None
    # Allow sleep / wake_up (the KV cache's and the weights' memory given back).
    enable_sleep_mode: bool = False

    hf_config: PretrainedConfig = field(init=False, repr=False)
    hf_text_config: PretrainedConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.model:
            self.model = embedded_model_path()
        if self.tokenizer is None:
            self.tokenizer = self.model
        self.gguf_file: str | None = self.model if is_gguf(self.model) else None
        self.hf_config = get_config(self.model, self.trust_remote_code, self.revision)
        if self.hf_overrides:
            # get_config is cached per path: override a copy, not the shared object.
            self.hf_config = copy.deepcopy(self.hf_config)
            for key, value in self.hf_overrides.items():
                setattr(self.hf_config, key, value)
        get_text = getattr(self.hf_config, "get_text_config", None)
        self.hf_text_config = get_text() if get_text else self.hf_config
        self.architectures: list[str] = list(self.hf_config.architectures or [])
        if isinstance(self.served_model_name, list):
            self.served_model_name = self.served_model_name[0] if self.served_model_name else None
        self.served_model_name = self.served_model_name or self.model
        self.dtype = self._resolve_dtype(self.dtype)
        self.encoder_config = get_sentence_transformer_tokenizer_config(self.model)
        self.max_model_len = self._resolve_max_model_len(_parse_max_model_len(self.max_model_len))
        self._verify_unbuilt_options()
        if self.logprobs_mode not in (
            "raw_logprobs",
            "raw_logits",
            "processed_logprobs",
            "processed_logits",
        ):
            raise ValueError(f"Invalid logprobs_mode: {self.logprobs_mode!r}")
        self._model_info, self._architecture = self._inspect()
        self.runner_type: RunnerType = self._resolve_runner_type()
        self.convert_type: ConvertType = self._resolve_convert_type()
        self._resolve_pooler_config()

    # ---- refusals -----------------------------------------------------------
    def _verify_unbuilt_options(self) -> None:
        """Refuse what this build parses but cannot honour, naming the flag."""
        if self.revision is not None:
            raise ValueError(
                f"revision={self.revision!r} (--revision) cannot be honoured: models are "
                "loaded from local paths only, so there is no hub revision to pick. Check "
                "out the revision into a folder and pass that folder instead."
            )
        if self.tokenizer_mode not in _TOKENIZER_MODES:
            built = "built" if self.tokenizer_mode in ("mistral", "custom") else "known"
            raise ValueError(
                f"tokenizer_mode={self.tokenizer_mode!r} (--tokenizer-mode) is not "
                f"{built} here; choose one of {_TOKENIZER_MODES}."
            )
        self._verify_quantization()

    def _verify_quantization(self) -> None:
        """Resolve `quantization` as upstream does: the checkpoint's
        `quantization_config.quant_method` when none is given; an explicit
        value that contradicts the checkpoint, one without a quantized
        checkpoint (unless the method quantizes at load: `-q fp8`), and an
        unbuilt method are refused before any weight is read.
        A .gguf file resolves to "gguf"."""
        from vllm.model_executor.layers.quantization import (
            BUILT_QUANTIZATION_METHODS,
            ONLINE_QUANTIZATION_METHODS,
            QUANTIZATION_METHODS,
            built_methods_summary,
            get_quantization_config,
        )

        asked = self.quantization.lower() if self.quantization is not None else None
        if asked is not None and asked not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization={self.quantization!r} (-q/--quantization) is not a known "
                f"method; choose one of {QUANTIZATION_METHODS}."
            )
        if asked is not None and asked != "gguf":
            get_quantization_config(asked)  # refuses an unbuilt method by name
        ckpt = "gguf" if self.gguf_file is not None else self._checkpoint_quant_method()
        if asked is not None and ckpt is not None and asked != ckpt:
            raise ValueError(
                f"Quantization method specified in the model config ({ckpt}) does not match "
                f"the quantization method specified in the `quantization` argument "
                f"(-q/--quantization {asked})."
            )
        if asked is not None and ckpt is None and asked not in ONLINE_QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization={asked!r} (-q/--quantization) needs a checkpoint quantized "
                f"with it, but {self.model!r} has no quantization_config (weights are not "
                f"quantized at load here, except with {list(ONLINE_QUANTIZATION_METHODS)})."
            )
        if ckpt is not None and ckpt != "gguf" and ckpt not in BUILT_QUANTIZATION_METHODS:
            raise ValueError(
                f"The checkpoint is quantized (quantization_config.quant_method={ckpt!r}) "
                f"with a method not built here (built: {built_methods_summary()})."
            )
        # `-q fp8` on an unquantized checkpoint quantizes it at load (online).
        self.quantization = ckpt if ckpt is not None else asked

    def _checkpoint_quant_method(self) -> str | None:
        """The checkpoint's `quantization_config.quant_method`, normalised
        (compressed_tensors -> compressed-tensors), or None."""
        quant_cfg = self.hf_quant_config()
        if quant_cfg is None:
            return None
        name = str(quant_cfg.get("quant_method", "")).lower().replace("_", "-")
        if name == "compressed-tensors":
            return name
        # Other names keep upstream's spelling (gptq_marlin, experts_int8, ...).
        return str(quant_cfg.get("quant_method", "")).lower() or "<missing quant_method>"

    def hf_quant_config(self) -> dict[str, Any] | None:
        """The checkpoint's `quantization_config` as a dict, or None. Without
        one in config.json, a method given with -q may find it in its own side
        file (quantize_config.json of GPTQ, quant_config.json of AWQ)."""
        quant_cfg = getattr(self.hf_config, "quantization_config", None)
        if quant_cfg is None and self.quantization is not None:
            from vllm.model_executor.layers.quantization import quant_config_from_files

            return quant_config_from_files(self.model, self.quantization.lower())
        if quant_cfg is None or isinstance(quant_cfg, dict):
            return quant_cfg
        to_dict = getattr(quant_cfg, "to_dict", None)
        return dict(to_dict()) if callable(to_dict) else dict(vars(quant_cfg))

    # ---- derivation helpers -------------------------------------------------
    def _inspect(self) -> tuple[_ModelInfo, str]:
        from vllm.model_executor.models.registry import ModelRegistry

        return ModelRegistry.inspect_model_cls(self.architectures, self)

    def _resolve_dtype(self, dtype: str | torch.dtype) -> torch.dtype:
        config_dtype = getattr(self.hf_config, "dtype", None)
        if isinstance(config_dtype, str):
            config_dtype = STR_DTYPE_TO_TORCH_DTYPE.get(config_dtype)
        if isinstance(dtype, torch.dtype):
            return dtype
        dtype = dtype.lower()
        if dtype != "auto":
            if dtype not in STR_DTYPE_TO_TORCH_DTYPE or dtype.startswith("fp8"):
                raise ValueError(f"Unknown dtype: {dtype!r}")
            return STR_DTYPE_TO_TORCH_DTYPE[dtype]
        return _resolve_auto_dtype(config_dtype)

    def _derived_max_model_len(self) -> int:
        """The context length the checkpoint allows, as upstream derives it: the
        smallest length key of the config, capped by the tokenizer's
        model_max_length, 2048 when nothing names one, times the RoPE scaling
        factor (except for llama3 / longrope / su, whose positions are already
        the scaled ones; yarn scales original_max_position_embeddings)."""
        cfg = self.hf_text_config
        values = [getattr(cfg, k) for k in _MAX_LEN_KEYS if getattr(cfg, k, None)]
        tokenizer_max = _tokenizer_model_max_length(self.tokenizer)
        if tokenizer_max is not None:
            values.append(tokenizer_max)
        derived = min(values) if values else 2048
        rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None)
        rope_type = (rope or {}).get("rope_type", (rope or {}).get("type"))
        if isinstance(rope, dict) and rope_type not in (
            None,
            "default",
            "su",
            "longrope",
            "llama3",
        ):
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                derived = rope["original_max_position_embeddings"]
            derived = derived * rope.get("factor", 1.0)
        # A sentence-transformers dir's max_seq_length (sentence_bert_config.json)
        # is the model's length, as upstream.
        encoder_config = getattr(self, "encoder_config", None)
        if encoder_config and encoder_config.get("max_seq_length"):
            derived = int(encoder_config["max_seq_length"])
        # RoBERTa / XLM-R number positions from pad_token_id + 1 (the model
        # shifts them), so only max_position_embeddings - pad_token_id - 1
        # tokens fit (512 of 514); a longer prompt would read past the table.
        if getattr(cfg, "model_type", None) in ("roberta", "xlm-roberta"):
            positions = getattr(cfg, "max_position_embeddings", None)
            pad = getattr(cfg, "pad_token_id", None)
            if positions and pad is not None:
                derived = min(derived, positions - pad - 1)
        return int(derived)

    def _resolve_max_model_len(self, max_model_len: int | None) -> int:
        derived = self._derived_max_model_len()
        if max_model_len is None or max_model_len == -1:
            return derived
        if max_model_len > derived:
            raise ValueError(
                f"User-specified max_model_len ({max_model_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={derived} in the model's config). "
                "This may lead to incorrect model outputs or errors."
            )
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {max_model_len}.")
        return max_model_len

    def _resolve_runner_type(self) -> RunnerType:
        """--runner auto, as upstream: a sentence-transformers dir is pooling
        (some use *ForCausalLM archs); then what the registered class is;
        then the architecture-name suffix."""
        if self.runner in ("generate", "pooling"):
            return self.runner  # type: ignore[return-value]
        if self.runner != "auto":
            raise ValueError(f"Unknown runner: {self.runner!r} (--runner: auto, generate, pooling)")
        if get_pooling_config(self.model) is not None:
            runner: RunnerType = "pooling"
        elif self._model_info.is_pooling_model:
            runner = "pooling"
        elif self._model_info.is_text_generation_model:
            runner = "generate"
        else:
            match = try_match_architecture_defaults(self._architecture)
            runner = match[1][0] if match else "generate"
        if runner != "generate":
            logger.info(
                "Resolved `--runner auto` to `--runner %s`. Pass the value explicitly to "
                "silence this message.",
                runner,
            )
        return runner

    def _resolve_convert_type(self) -> ConvertType:
        if self.convert not in _CONVERT_OPTIONS:
            raise ValueError(f"Unknown convert: {self.convert!r} (--convert: {_CONVERT_OPTIONS})")
        info = self._model_info
        if self.convert != "auto":
            convert: ConvertType = self.convert  # type: ignore[assignment]
        elif self.runner_type == "generate" or info.is_pooling_model:
            convert = "none"
        else:
            match = try_match_architecture_defaults(self._architecture, runner_type="pooling")
            convert = match[1][1] if match else "embed"
        if self.runner_type == "generate" and convert != "none":
            raise ValueError(f"--convert {convert} needs --runner pooling.")
        if self.runner_type == "generate" and not info.is_text_generation_model:
            raise ValueError(
                f"Model {self.model!r} ({self._architecture}) does not support "
                "`--runner generate`: it is a pooling model."
            )
        if self.runner_type == "pooling" and not info.is_pooling_model and convert == "none":
            raise ValueError(
                f"Model {self.model!r} ({self._architecture}) does not support `--runner "
                "pooling`. You can pass `--convert <embed|classify|reward>` to adapt it into "
                "a pooling model."
            )
        return convert

    def _resolve_pooler_config(self) -> None:
        """--pooler-config, then the sentence-transformers files' values for
        the fields left None, then the model's default pooling types (a
        sequence type for embed / classify, ALL or the model's token type for
        the token tasks), as upstream v0.28."""
        if self.runner_type != "pooling":
            if self.pooler_config is not None:
                raise ValueError("pooler_config (--pooler-config) needs --runner pooling.")
            return
        raw: Any = self.pooler_config
        config = PoolerConfig.from_cli(raw or {})
        user_seq = config.seq_pooling_type
        for key, value in (get_pooling_config(self.model) or {}).items():
            if getattr(config, key) is None:
                setattr(config, key, value)
        default = self.default_pooling_type
        if default in SEQ_POOLING_TYPES:
            if config.seq_pooling_type is None:
                config.seq_pooling_type = default
            if config.tok_pooling_type is None:
                config.tok_pooling_type = "ALL"
        else:
            # Token-wise tasks alone (--convert reward): no sequence pooling
            # (a sentence-transformers dir's is ignored, a user's refused).
            config.seq_pooling_type = None
            if user_seq is not None:
                raise ValueError(
                    f"pooler_config.seq_pooling_type={user_seq!r}: "
                    f"{self._architecture} pools token-wise only (tasks token_embed / "
                    "token_classify); use ALL or STEP."
                )
            if config.tok_pooling_type is None:
                config.tok_pooling_type = default
        config.verify_step_fields()
        self.pooler_config = config

    @property
    def default_pooling_type(self) -> str:
        """The model class's (converted decoders: LAST; --convert reward: ALL,
        as upstream's as_reward_model)."""
        if self._model_info.is_pooling_model:
            return self._model_info.default_pooling_type
        return "ALL" if self.convert_type == "reward" else "LAST"

    @property
    def head_dtype(self) -> torch.dtype:
        """Pooler heads run in float32 (config `head_dtype` overrides; "model":
        the model dtype), as upstream's _get_head_dtype."""
        head_dtype = getattr(self.hf_config, "head_dtype", None)
        if head_dtype == "model":
            return self.dtype  # type: ignore[return-value]
        if isinstance(head_dtype, str):
            if head_dtype.lower() not in STR_DTYPE_TO_TORCH_DTYPE:
                raise ValueError(f"Unknown head_dtype: {head_dtype!r}")
            return STR_DTYPE_TO_TORCH_DTYPE[head_dtype.lower()]
        if isinstance(head_dtype, torch.dtype):
            return head_dtype
        return torch.float32 if self.runner_type == "pooling" else self.dtype  # type: ignore[return-value]

    @property
    def is_matryoshka(self) -> bool:
        return bool(getattr(self.hf_config, "matryoshka_dimensions", None)) or bool(
            getattr(self.hf_config, "is_matryoshka", False)
        )

    @property
    def embedding_size(self) -> int:
        """The width of the model's embeddings: the config's own
        `embedding_size` if set, else the last sentence-transformers Dense
        module's out_features, else the hidden size (as upstream)."""
        from vllm.transformers_utils.config import try_get_dense_modules

        override = getattr(self.hf_config, "embedding_size", None)
        if override is not None:
            return int(override)
        dense = try_get_dense_modules(self.model)
        if dense is not None and "out_features" in dense[-1]:
            return int(dense[-1]["out_features"])
        return self.get_hidden_size()

    @property
    def matryoshka_dimensions(self) -> list[int] | None:
        return getattr(self.hf_config, "matryoshka_dimensions", None)

    def get_pooling_task(self, supported_tasks: tuple[str, ...]) -> PoolingTask | None:
        """The task of the model's pooling requests (LLM.encode, `/pooling`),
        as upstream v0.28: pooler_config.task if set (it must be supported),
        else token_classify for a *ForTokenClassification model, else the
        first supported of embed, classify, token_embed, token_classify."""
        if self.pooler_config is None:
            return None
        task = self.pooler_config.task
        if task is not None:
            if task not in supported_tasks:
                raise RuntimeError(f"Unsupported task: {task!r} Supported tasks: {supported_tasks}")
            return task
        if "token_classify" in supported_tasks and "ForTokenClassification" in self._architecture:
            return "token_classify"
        return next((t for t in POOLING_TASKS if t in supported_tasks), None)

    @property
    def is_cross_encoder(self) -> bool:
        """A classifier scoring text pairs (LLM.score)."""
        return self.runner_type == "pooling" and (
            self._model_info.supports_cross_encoding or self.convert_type == "classify"
        )

    @property
    def attn_type(self) -> str:
        """ "encoder_only" for bidirectional pooling models (CLS pooling or
        config.is_causal False), else "decoder"."""
        if self.runner_type == "pooling":
            pooling = (
                self._model_info.default_pooling_type
                if self._model_info.is_pooling_model
                else "LAST"
            )
            if pooling == "CLS" or not getattr(self.hf_config, "is_causal", True):
                return "encoder_only"
        return "decoder"

    # ---- derived flags --------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self._architecture

    @property
    def is_encoder_decoder(self) -> bool:
        # Read from the HF config as upstream; no encoder-decoder model is
        # registered here, so loading one fails on its architecture.
        return bool(getattr(self.hf_config, "is_encoder_decoder", False))

    @property
    def is_attention_free(self) -> bool:
        return self._model_info.is_attention_free

    @property
    def is_hybrid(self) -> bool:
        # Hybrid classes count only if their layers really mix kinds.
        if not self._model_info.is_hybrid:
            return False
        layer_types = getattr(self.hf_text_config, "layer_types", None)
        return layer_types is None or not all(
            t in ("attention", "full_attention") for t in layer_types
        )

    @property
    def has_inner_state(self) -> bool:
        return self._model_info.has_inner_state

    def get_num_experts(self) -> int:
        cfg = self.hf_text_config
        for key in _NUM_EXPERTS_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, list):
                value = max(value) if value else 0
            if value:
                return int(value)
        block_configs = getattr(cfg, "block_configs", None) or []
        counts = [getattr(getattr(b, "ffn", None), "num_experts", 0) or 0 for b in block_configs]
        return max(counts, default=0)

    def _pooling_supports_chunks(self) -> bool:
        """Pooling models, as upstream: bidirectional ones never; causal ones
        with LAST / ALL / STEP pooling do (MEAN / CLS need the whole prompt)."""
        if self.attn_type == "encoder_only":
            return False
        assert self.pooler_config is not None
        return self.pooler_config.seq_pooling_type not in ("MEAN", "CLS")

    @property
    def is_chunked_prefill_supported(self) -> bool:
        # Upstream: every generative decoder model (encoder-decoder ones are
        # not built here); pooling models per _pooling_supports_chunks.
        if self.runner_type == "pooling":
            return self._pooling_supports_chunks()
        return True

    @property
    def is_prefix_caching_supported(self) -> bool:
        # Upstream: decoder-only generative models; off by default for hybrid
        # and attention-free ones ("still experimental" there).
        if self.runner_type == "pooling":
            return self._pooling_supports_chunks()
        return not self.is_hybrid and not self.is_attention_free

    @property
    def is_moe(self) -> bool:
        return self.get_num_experts() > 0

    @property
    def is_quantized(self) -> bool:
        return (
            getattr(self.hf_config, "quantization_config", None) is not None
            or self.quantization is not None
        )

    # ---- shape helpers -------------------------------------------------------
    # The HF config's attributes are untyped (Any): int() states what they are.
    def get_vocab_size(self) -> int:
        return int(self.hf_text_config.vocab_size)

    def get_hidden_size(self) -> int:
        return int(self.hf_text_config.hidden_size)

    def get_head_size(self) -> int:
        cfg = self.hf_text_config
        head_dim = getattr(cfg, "head_dim", None)
        if head_dim:
            return int(head_dim)
        return int(cfg.hidden_size // cfg.num_attention_heads)

    def get_total_num_kv_heads(self) -> int:
        cfg = self.hf_text_config
        return int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)

    def get_num_kv_heads(self, parallel_config: ParallelConfig) -> int:
        # With TP > #kv heads, each KV head is replicated across ranks.
        return max(1, self.get_total_num_kv_heads() // parallel_config.tensor_parallel_size)

    def get_num_attention_heads(self, parallel_config: ParallelConfig) -> int:
        return int(self.hf_text_config.num_attention_heads) // parallel_config.tensor_parallel_size

    def get_total_num_hidden_layers(self) -> int:
        return int(self.hf_text_config.num_hidden_layers)

    def get_num_layers(self, parallel_config: ParallelConfig) -> int:
        return self.get_total_num_hidden_layers() // parallel_config.pipeline_parallel_size

    def get_sliding_window(self) -> int | None:
        cfg = self.hf_text_config
        if getattr(cfg, "use_sliding_window", True) is False:
            return None
        return getattr(cfg, "sliding_window", None)

    def get_eos_token_id(self) -> int | list[int] | None:
        return getattr(self.hf_config, "eos_token_id", None)

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """Default sampling parameters from generation_config.json
        (`generation_config="auto"`); `"vllm"` disables them."""
        if self.generation_config == "vllm":
            return {}
        source = self.model if self.generation_config == "auto" else self.generation_config
        gen = try_get_generation_config(source)
        params = {k: gen[k] for k in _GEN_CONFIG_KEYS if gen.get(k) is not None}
        if gen.get("max_new_tokens") is not None:
            params["max_tokens"] = gen["max_new_tokens"]
        return params

    def try_get_generation_config(self) -> dict[str, Any]:
        if self.generation_config == "vllm":
            return {}
        source = self.model if self.generation_config == "auto" else self.generation_config
        return try_get_generation_config(source)
