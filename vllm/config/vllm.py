"""The whole engine configuration (upstream: vllm/config/vllm.py), and the
rule that picks the model runner for each model (upstream PR #44443).

`VllmConfig` cross-checks the per-concern configs and decides, per model,
the model runner (`_is_default_v2_model_runner_model`, overridden by
VLLM_USE_V2_MODEL_RUNNER; read as `use_v2_model_runner`) and how many
batches the engine core keeps in flight (`max_concurrent_batches`: the
pipeline depth, one more under async scheduling except for V1 with
pipeline parallelism).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm import envs
from vllm.config.attention import AttentionConfig
from vllm.config.cache import CacheConfig
from vllm.config.compilation import CompilationConfig, CompilationMode
from vllm.config.device import DeviceConfig
from vllm.config.ec_transfer import ECTransferConfig
from vllm.config.kv_events import KVEventsConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.config.load import LoadConfig
from vllm.config.lora import LoRAConfig
from vllm.config.model import ModelConfig
from vllm.config.observability import ObservabilityConfig
from vllm.config.parallel import ParallelConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.config.structured_outputs import StructuredOutputsConfig
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

logger = init_logger(__name__)

# MoE architectures that default to Model Runner V2. Dense models need no
# entry: every dense generative model defaults to V2 (see
# `_is_default_v2_model_runner_model`).
DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "GraniteMoeForCausalLM",
    }
)


# Speculative decoding methods the engine runs (all on the V1 model runner);
# every other method SpeculativeConfig accepts is refused by name.
SPEC_DECODE_BUILT_METHODS: tuple[str, ...] = ("ngram", "draft_model", "eagle", "eagle3", "suffix")
# Methods upstream runs under async scheduling (EAGLE family, ngram_gpu,
# draft_model, dspark); others turn it off. The built ones (draft_model,
# eagle, eagle3) run async on the V1 runner (vllm/v1/worker/async_spec_decode.py).
_ASYNC_SPEC_METHODS = ("eagle", "eagle3", "mtp", "ngram_gpu", "draft_model", "dspark")


def _v2_model_runner_built() -> bool:
    """Whether this build ships Model Runner V2 (vllm/v1/worker/gpu/)."""
    try:
        return importlib.util.find_spec("vllm.v1.worker.gpu.model_runner") is not None
    except ModuleNotFoundError:  # the vllm.v1.worker.gpu package itself is absent
        return False


@dataclass
class VllmConfig:
    """All configuration, one dataclass per concern."""

    model_config: ModelConfig | None = None
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    attention_config: AttentionConfig = field(default_factory=AttentionConfig)
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig
    )
    # LoRA adapters (--enable-lora); None: requests may not name an adapter.
    lora_config: LoRAConfig | None = None
    # Request tracing (--otlp-traces-endpoint).
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    # Upstream's records for features not built here: refused when set.
    kv_transfer_config: KVTransferConfig | None = None
    kv_events_config: KVEventsConfig | None = None
    ec_transfer_config: ECTransferConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    # The checkpoint's quantization, parsed (None: unquantized); set from
    # model_config.
    quant_config: QuantizationConfig | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._refuse_unbuilt_features()
        mc = self.model_config
        if mc is not None:
            self.scheduler_config.verify_with_model_len(mc.max_model_len)
            self.quant_config = self._get_quantization_config(mc, self.device_config.device_type)
        self.compilation_config.resolve(
            self.device_config.device_type, mc.enforce_eager if mc else False
        )
        if self.lora_config is not None:
            self._verify_lora_config(self.lora_config, mc)
        self._resolve_async_scheduling()

    @staticmethod
    def _get_quantization_config(
        model_config: ModelConfig, device_type: str = "cpu"
    ) -> QuantizationConfig | None:
        """Parse the checkpoint's quantization_config with the resolved
        method's class (upstream: VllmConfig._get_quantization_config): an
        unbuilt scheme, a model dtype the method's kernels do not take, or a
        device without its kernels (min capability -1: CPU kernels only) is
        refused here, at start-up."""
        from vllm.model_executor.layers.quantization import (
            ONLINE_QUANTIZATION_METHODS,
            get_quantization_config,
        )

        # getattr: stand-in model configs (tests) carry only what they use.
        method = getattr(model_config, "quantization", None)
        if method is None:
            return None
        # A .gguf file has no quantization_config: its loader fills GGUFConfig.
        hf_quant = {} if method == "gguf" else model_config.hf_quant_config()
        if hf_quant is None and method not in ONLINE_QUANTIZATION_METHODS:
            return None
        quant_cls = get_quantization_config(method)
        # No quantization_config: `-q fp8` quantizes at load, with the
        # method's defaults (upstream builds `quant_cls()` the same way).
        quant_config = quant_cls() if hf_quant is None else quant_cls.from_config(hf_quant)
        supported = quant_config.get_supported_act_dtypes()
        if model_config.dtype not in supported:
            raise ValueError(
                f"dtype={model_config.dtype} (--dtype) is not supported for quantization "
                f"method {method!r}; supported: {[str(d) for d in supported]}."
            )
        if device_type != "cpu" and quant_config.get_min_capability() < 0:
            raise ValueError(
                f"Quantization method {method!r} has CPU kernels only here; the {device_type} "
                "kernels are not built (the weights are never dequantized instead)."
            )
        return quant_config

    def _verify_lora_config(self, lora_config: LoRAConfig, mc: ModelConfig | None) -> None:
        """Resolve the adapters' dtype against the model (upstream:
        `lora_config.verify_with_model_config` in `VllmConfig.__post_init__`)
        and refuse the combinations this build cannot run, naming the flag.
        Pooling models take adapters too (their body's layers, as upstream)."""
        if mc is not None:
            lora_config.verify_with_model_config(mc)
        mode = self.compilation_config.mode
        if mode != CompilationMode.NONE:
            # As the runner's load_lora_model, before any process starts:
            # Inductor fails on the CPU LoRA plans (unbacked sizes).
            raise NotImplementedError(
                f"enable_lora (--enable-lora) with compilation_config.mode={mode.name} "
                "(--compilation-config): the LoRA layers are not torch.compile-able in this "
                "build; use compilation mode NONE (the default)."
            )
        tp = self.parallel_config.tensor_parallel_size
        if lora_config.fully_sharded_loras and lora_config.max_lora_rank % tp:
            # The fully sharded layers split the rank over the TP ranks too.
            raise ValueError(
                f"max_lora_rank ({lora_config.max_lora_rank}, --max-lora-rank) must be "
                f"divisible by tensor_parallel_size ({tp}) with fully_sharded_loras "
                "(--fully-sharded-loras)."
            )

    # ---- model runner choice ---------------------------------------------------
    def _is_default_v2_model_runner_model(self) -> bool:
        """Whether this model defaults to Model Runner V2.

        1. Only generative models ("generate" runner).
        2. Hybrid models (e.g. Qwen3.5) and attention-free models (e.g. Mamba)
           stay on V1.
        3. MoE models need an entry in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES;
           every other (dense) model defaults to V2.
        """
        model_config = self.model_config
        if model_config is None:
            return False
        if model_config.runner_type != "generate":
            return False
        if getattr(model_config, "is_hybrid", False):
            return False
        if getattr(model_config, "is_attention_free", False):
            return False
        architectures = getattr(model_config, "architectures", None) or []
        return (
            any(arch in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES for arch in architectures)
            or not model_config.is_moe
        )

    def _get_v2_model_runner_unsupported_features(self) -> list[str]:
        features = []
        if self.compilation_config.mode == CompilationMode.STOCK_TORCH_COMPILE:
            features.append("stock torch.compile")
        spec = self.speculative_config
        if spec is not None:
            # Upstream's entries: V2 serves the EAGLE family (here eagle and
            # eagle3; mtp / dflash / dspark are refused earlier by name).
            if spec.method in ("ngram", "ngram_gpu"):
                features.append("ngram/ngram_gpu speculative decoding")
            elif spec.method not in ("eagle", "eagle3", "mtp", "dflash", "dspark"):
                features.append(f"speculative method '{spec.method}'")
            if spec.parallel_drafting and spec.method not in ("dflash", "dspark"):
                features.append("parallel drafting for EAGLE speculative decoding")
        return features

    @property
    def use_v2_model_runner(self) -> bool:
        """Which model runner the worker builds and the scheduler talks to.

        VLLM_USE_V2_MODEL_RUNNER (unset / "0" / "1") overrides the default;
        otherwise V2 for the models `_is_default_v2_model_runner_model` admits,
        unless a feature V2 lacks is on.
        """
        forced = envs.VLLM_USE_V2_MODEL_RUNNER
        if forced is not None:
            if forced and not _v2_model_runner_built():
                raise ValueError(
                    "VLLM_USE_V2_MODEL_RUNNER=1 but Model Runner V2 is not built in this version."
                )
            if forced and getattr(self.model_config, "runner_type", None) == "pooling":
                # The seed's rule: pooling models run on the V1 runner.
                raise ValueError(
                    "VLLM_USE_V2_MODEL_RUNNER=1 but pooling models (runner='pooling') run on "
                    "the V1 model runner only."
                )
            spec_unsupported = [
                f
                for f in self._get_v2_model_runner_unsupported_features()
                if "speculative" in f or "drafting" in f
            ]
            if forced and spec_unsupported:
                # Upstream's _validate_v2_model_runner: an error, not a fallback.
                raise ValueError(
                    "VLLM_USE_V2_MODEL_RUNNER=1 but Model Runner V2 does not yet support: "
                    f"{', '.join(spec_unsupported)} (unset it to use the V1 model runner)."
                )
            return bool(forced)
        if not self._is_default_v2_model_runner_model():
            return False
        unsupported = self._get_v2_model_runner_unsupported_features()
        if unsupported:
            logger.warning_once(
                "Model Runner V2 does not yet support %s; using the V1 model runner instead.",
                ", ".join(unsupported),
            )
            return False
        if not _v2_model_runner_built():
            logger.info_once("Model Runner V2 is not built yet; using the V1 model runner.")
            return False
        return True

    # ---- async scheduling and batches in flight ------------------------------------------
    def _async_scheduling_unsupported_reason(self) -> str | None:
        """Why async scheduling cannot run here, or None when it can."""
        if self.model_config is None:
            return "no model"
        if getattr(self.model_config, "runner_type", None) == "pooling":
            # As upstream: a pooling request ends after its prefill; there is
            # no next token to schedule ahead.
            return "pooling models do not support it"
        backend = self.parallel_config.distributed_executor_backend
        if isinstance(backend, type):
            if not backend.supports_async_scheduling():
                return f"executor {backend.__name__} does not support it"
        elif backend not in ("uni", "mp", "ray"):
            return f"the {backend!r} executor does not support it"
        if not self.use_v2_model_runner and self.parallel_config.pipeline_parallel_size > 1:
            # As upstream: V1 runs ahead only with one pipeline stage.
            return "Model Runner V1 does not support it with pipeline parallelism"
        return None

    def _async_scheduling_off_by_default_reason(self) -> str | None:
        """Where async scheduling works but costs more than it gives.

        With one worker on the CPU the forward pass already uses every core,
        so overlapping the next step's scheduling with it gains nothing, while
        the scheduler thread and the worker thread fight over the GIL:
        measured 1395 vs 1182 output tok/s (64 x 128 -> 128, bf16 Qwen2-120M).
        Multi-process executors overlap for real and keep it on, as upstream.
        """
        if (
            self.device_config.device_type == "cpu"
            and self.parallel_config.distributed_executor_backend == "uni"
        ):
            return "one CPU worker: the overlap gains nothing and costs GIL contention"
        return None

    def _refuse_unbuilt_features(self) -> None:
        """Upstream's records for features not built here are accepted; asking
        for one of those features is an error that names it."""
        kv_transfer, ec_transfer = self.kv_transfer_config, self.ec_transfer_config
        if kv_transfer is not None and kv_transfer.kv_connector is not None:
            raise NotImplementedError(
                f"kv_transfer_config.kv_connector={kv_transfer.kv_connector!r}: "
                "KV connectors (--kv-transfer-config) are not built yet."
            )
        if ec_transfer is not None and ec_transfer.ec_connector is not None:
            raise NotImplementedError(
                f"ec_transfer_config.ec_connector={ec_transfer.ec_connector!r}: "
                "encoder-cache connectors (--ec-transfer-config) are not built yet."
            )
        if self.speculative_config is not None:
            self._refuse_unbuilt_speculation(self.speculative_config)
        kv_events = self.kv_events_config
        if (
            kv_events is not None
            and kv_events.enable_kv_cache_events
            and kv_events.publisher != "null"
        ):
            raise NotImplementedError(
                f"kv_events_config.publisher={kv_events.publisher!r}: publishing KV "
                "cache events is not built yet (only publisher='null')."
            )

    def _refuse_unbuilt_speculation(self, spec: SpeculativeConfig) -> None:
        """After SpeculativeConfig's own validation (bad input gets its
        specific error first): methods and options no runner here serves are
        refused by name."""
        if spec.method not in SPEC_DECODE_BUILT_METHODS:
            raise NotImplementedError(
                f"speculative_config: speculative decoding method {spec.method!r} is not "
                f"built yet (--speculative-config); built: {', '.join(SPEC_DECODE_BUILT_METHODS)}."
            )
        if spec.num_speculative_tokens_per_batch_size is not None:
            raise NotImplementedError(
                "speculative_config.num_speculative_tokens_per_batch_size: dynamic "
                "speculative decoding is not built yet."
            )
        if spec.rejection_sample_method != "standard":
            raise NotImplementedError(
                f"speculative_config.rejection_sample_method={spec.rejection_sample_method!r} "
                "is not built yet (only 'standard')."
            )
        if self.parallel_config.pipeline_parallel_size > 1:
            raise NotImplementedError(
                "speculative_config with pipeline_parallel_size > 1: speculative decoding "
                "with pipeline parallelism is not built yet."
            )
        if getattr(self.model_config, "runner_type", None) == "pooling":
            raise NotImplementedError(
                "speculative_config with a pooling model (runner='pooling'): pooling "
                "requests sample no tokens to speculate on."
            )

    def _speculative_async_rule(self) -> None:
        """Async scheduling under speculative decoding, upstream's rule: the
        EAGLE family and draft_model run async; any other method (ngram,
        suffix) refuses an explicit True and turns the default off."""
        spec, sc = self.speculative_config, self.scheduler_config
        if spec is None or sc.async_scheduling is False or spec.method in _ASYNC_SPEC_METHODS:
            return
        if sc.async_scheduling:
            raise ValueError(
                "Currently, async scheduling is only supported with "
                "EAGLE/MTP/Draft Model/NGram GPU/DSpark kind of speculative decoding"
            )
        logger.warning_once(
            "Async scheduling not supported with %s-based speculative decoding and "
            "will be disabled.",
            spec.method,
        )
        sc.async_scheduling = False

    def _resolve_async_scheduling(self) -> None:
        """None -> on where supported (and worth it); an explicit True that
        cannot work raises."""
        self._speculative_async_rule()
        sc = self.scheduler_config
        reason = self._async_scheduling_unsupported_reason()
        if sc.async_scheduling is None:
            reason = reason or self._async_scheduling_off_by_default_reason()
            sc.async_scheduling = reason is None
        elif sc.async_scheduling and reason is not None:
            raise ValueError(f"Async scheduling was requested but {reason}.")
        if self.model_config is not None:
            logger.info_once(
                "Async scheduling: %s", "on" if sc.async_scheduling else f"off ({reason})"
            )

    @property
    def max_concurrent_batches(self) -> int:
        """Batches the engine core keeps in flight (its batch queue size)."""
        pp = self.parallel_config.pipeline_parallel_size
        if not self.scheduler_config.async_scheduling:
            return pp
        if self.use_v2_model_runner:
            return pp + 1
        return 2 if pp <= 1 else pp

    def __str__(self) -> str:
        mc = self.model_config
        return (
            f"model={mc.model if mc else None!r}, dtype={mc.dtype if mc else None}, "
            f"max_model_len={mc.max_model_len if mc else None}, "
            f"device={self.device_config.device_type}, "
            f"block_size={self.cache_config.block_size}, "
            f"enable_prefix_caching={self.cache_config.enable_prefix_caching}, "
            f"max_num_batched_tokens={self.scheduler_config.max_num_batched_tokens}, "
            f"max_num_seqs={self.scheduler_config.max_num_seqs}, "
            f"async_scheduling={self.scheduler_config.async_scheduling}, "
            f"tp={self.parallel_config.tensor_parallel_size}, "
            f"pp={self.parallel_config.pipeline_parallel_size}, "
            f"lora={self.lora_config is not None}"
        )


_current_vllm_config: ContextVar[VllmConfig | None] = ContextVar("vllm_config", default=None)


@contextlib.contextmanager
def set_current_vllm_config(vllm_config: VllmConfig) -> Iterator[None]:
    """Make `vllm_config` visible to layers built inside the block (model init)."""
    token = _current_vllm_config.set(vllm_config)
    try:
        yield
    finally:
        _current_vllm_config.reset(token)


def get_current_vllm_config_or_none() -> VllmConfig | None:
    """The config set by `set_current_vllm_config`, or None outside it."""
    return _current_vllm_config.get()


def get_current_vllm_config() -> VllmConfig:
    config = _current_vllm_config.get()
    if config is None:
        logger.warning_once(
            "get_current_vllm_config() called outside "
            "set_current_vllm_config(); using a default VllmConfig."
        )
        return VllmConfig()
    return config
