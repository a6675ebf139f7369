"""Speculative decoding configuration (upstream: vllm/config/speculative.py).

`EngineArgs` builds it from `--speculative-config` JSON (plus `--spec-method`,
`--spec-model`, `--spec-tokens`) with the target's model and parallel configs.
Construction resolves and validates as upstream does: the method (given, or
detected from `model`), the n-gram window (`prompt_lookup_min/max`), the draft
model's config (its own `ModelConfig`, same vocabulary as the target), the
draft tensor-parallel size and max_model_len, the rejection-sampling options.

Speculative decoding itself is not wired into the engine yet: `VllmConfig`
refuses any `speculative_config` after this validation, naming the method, so
bad input still gets the specific error first.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config.load import LoadConfig
    from vllm.config.model import ModelConfig
    from vllm.config.parallel import ParallelConfig

logger = init_logger(__name__)

MTPModelTypes = Literal[
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    "exaone4_5_mtp", "qwen3_next_mtp", "qwen3_5_mtp", "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "gemma4_mtp", "inkling_mtp",
]  # fmt: skip
EagleModelTypes = Literal["eagle", "eagle3", "extract_hidden_states", MTPModelTypes, "dflash"]
SpeculativeMethod = Literal[
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class",
    EagleModelTypes, "ngram_gpu", "dspark",
]  # fmt: skip
RejectionSampleMethod = Literal["standard", "synthetic", "block"]
DraftSampleMethod = Literal["greedy", "probabilistic"]

# Suffix decoding's library (arctic-inference: PyPI ships only its sdist, a
# C++ extension built with nanobind). Its build requirements name torch, so an
# isolated build would download a CUDA torch: build it in the environment.
ARCTIC_INFERENCE_INSTALL_HINT = (
    "Install via `pip install nanobind==2.9.2 && pip install --no-deps --no-build-isolation "
    "arctic-inference==0.3.0` (a source build of a small C++ extension, ~30 s; without "
    "--no-build-isolation pip downloads a CUDA torch to build it)."
)
# The suffix-decoding fields and their defaults (used by method "suffix" only).
_SUFFIX_DEFAULTS: dict[str, float] = {
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}
# Methods that need no draft checkpoint: `model` names the method itself.
_MODEL_FREE = {"ngram": "ngram", "ngram_gpu": "ngram_gpu", "suffix": "suffix"}
_MODEL_FREE["extract_hidden_states"] = "extract_hidden_states"
# Integer fields with a lower bound (upstream: pydantic Field(gt/ge)).
_LOWER_BOUNDS = {
    "draft_tensor_parallel_size": 1,
    "max_model_len": 1,
    "prompt_lookup_max": 1,
    "prompt_lookup_min": 1,
    "dspark_draft_topk": 1,
}


@dataclass
class SpeculativeConfig:
    """Configuration for speculative decoding."""

    # Override the target's enforce_eager for the drafter.
    enforce_eager: bool | None = None
    # Tokens drafted per step; defaults to the draft config's n_predict, else required.
    num_speculative_tokens: int | None = None
    # Draft model, EAGLE head or extra weights (a local path), or "ngram".
    model: str | None = None
    # None: detected from `model` ("ngram" -> ngram, else draft_model / eagle / ...).
    method: str | None = None
    # Draft tensor parallelism: 1 or the target's tensor_parallel_size.
    draft_tensor_parallel_size: int | None = None
    # Not a valid field: set only to tell users to pass draft_tensor_parallel_size.
    tensor_parallel_size: int | None = None
    quantization: str | None = None
    moe_backend: str | None = None
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    # Draft max_model_len (<= the draft's and the target's).
    max_model_len: int | None = None
    revision: str | None = None
    code_revision: str | None = None
    disable_padded_drafter_batch: bool = False
    use_local_argmax_reduction: bool = False
    # Draft and target with different vocabularies (draft_model, greedy only).
    use_heterogeneous_vocab: bool = False
    # n-gram window: both unset -> 5/5; one set -> the other copies it; min <= max.
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    parallel_drafting: bool = False
    # Passed by the engine, not by users.
    target_model_config: ModelConfig | None = None
    target_parallel_config: ParallelConfig | None = None
    # [(batch_size_start, batch_size_end, num_speculative_tokens), ...] (inclusive).
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None
    # Built here for model-based methods (the target's for ngram).
    draft_model_config: ModelConfig | None = None
    draft_parallel_config: ParallelConfig | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    draft_load_config: LoadConfig | None = None
    rejection_sample_method: RejectionSampleMethod = "standard"
    # Per-position unconditional acceptance rates ('synthetic' only), or their mean length.
    synthetic_acceptance_rates: list[float] | None = None
    synthetic_acceptance_length: float | None = None
    enable_adaptive_verification: bool = False
    draft_sample_method: DraftSampleMethod = "greedy"
    dspark_draft_topk: int | None = None

    def __post_init__(self) -> None:
        self._check_field_values()
        self._resolve_method()
        self._check_suffix_fields()
        if self.method == "ngram" or self.method == "ngram_gpu":
            self._resolve_ngram_window()
            self.draft_model_config = self.target_model_config
            self.draft_parallel_config = self.target_parallel_config
        elif self.method == "suffix":
            self._validate_suffix_decoding()
        elif self.method in ("custom_class", "extract_hidden_states"):
            self.prompt_lookup_max = self.prompt_lookup_min = 0
            self.draft_model_config = self.target_model_config
            self.draft_parallel_config = self.target_parallel_config
        else:
            self.prompt_lookup_max = self.prompt_lookup_min = 0
            if self.model is not None:
                self._resolve_draft_model()
        if self.method != "dspark" and self.enable_adaptive_verification:
            raise ValueError("Adaptive verification only supported with DSpark")
        self._verify_args()

    # ---- field checks (upstream: pydantic types and bounds) ------------------
    def _check_field_values(self) -> None:
        methods = _speculative_methods()
        if self.method is not None and self.method not in methods:
            raise ValueError(
                f"speculative_config.method={self.method!r} is not a speculative method; "
                f"choose one of {sorted(methods)}."
            )
        n = self.num_speculative_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer: {n!r}")
        if n is not None and n <= 0:
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({n}).")
        for name, low in _LOWER_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"speculative_config.{name} must be an integer, got {value!r}")
            if value is not None and value < low:
                raise ValueError(f"speculative_config.{name}={value} must be >= {low}")
        for name, kind in (
            ("rejection_sample_method", RejectionSampleMethod),
            ("draft_sample_method", DraftSampleMethod),
        ):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(
                    f"speculative_config.{name}={getattr(self, name)!r}: "
                    f"choose one of {list(get_args(kind))}."
                )

    # ---- method ---------------------------------------------------------------
    def _resolve_method(self) -> None:
        """Detect the method from `model` when not given; fill `model` for the
        methods that need no checkpoint (upstream's __post_init__ head)."""
        if self.method is None and _is_custom_proposer_path(self.model):
            self.method = "custom_class"
        elif self.method is None:
            self.method = "ngram" if self.model in ("ngram", "[ngram]") else "draft_model"
        if self.method in get_args(MTPModelTypes) and self.method != "mtp":
            logger.warning("method `%s` is deprecated and replaced with mtp.", self.method)
            self.method = "mtp"
        if self.model is not None or self.num_speculative_tokens is None:
            return
        if self.method in _MODEL_FREE:
            self.model = _MODEL_FREE[self.method]
        elif self.method in ("mtp", "dspark"):
            # The draft layers ship inside the target checkpoint.
            if self.target_model_config is None:
                raise ValueError(f"target_model_config must be present for {self.method}")
            self.model = self.target_model_config.model
            self.quantization = self.quantization or self.target_model_config.quantization
        elif self.method == "custom_class":
            raise ValueError(
                "method='custom_class' requires 'model' to contain the custom proposer "
                "module path (e.g., 'my_module.MyProposer')."
            )
        else:
            raise ValueError("num_speculative_tokens was provided but without speculative model.")

    def _resolve_ngram_window(self) -> None:
        """Upstream's defaults: neither bound given -> 5 and 5; one given -> both."""
        if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
            self.prompt_lookup_min = self.prompt_lookup_max = 5
        elif self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif self.prompt_lookup_max is None:
            self.prompt_lookup_max = self.prompt_lookup_min
        assert self.prompt_lookup_min is not None and self.prompt_lookup_max is not None
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min={self.prompt_lookup_min} must be "
                f"<= prompt_lookup_max={self.prompt_lookup_max}"
            )

    def _check_suffix_fields(self) -> None:
        """The suffix_decoding_* fields' types (upstream: pydantic int/float);
        with another method a value set away from its default is refused (it
        would have no effect)."""
        for name, default in _SUFFIX_DEFAULTS.items():
            value = getattr(self, name)
            kinds: tuple[type, ...] = (int,) if isinstance(default, int) else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                kind = "an integer" if kinds == (int,) else "a number"
                raise ValueError(f"speculative_config.{name} must be {kind}, got {value!r}")
            if self.method != "suffix" and value != default:
                raise ValueError(
                    f"speculative_config.{name}={value!r} only applies to method='suffix' "
                    f"(method={self.method!r})."
                )

    def _validate_suffix_decoding(self) -> None:
        """Upstream's checks for method "suffix": the library is importable,
        num_speculative_tokens defaults to the tree depth (it is only a cap:
        each draft's length is decided per step), the bounds."""
        if importlib.util.find_spec("arctic_inference") is None:
            raise ImportError(
                f"Arctic Inference is required for suffix decoding. {ARCTIC_INFERENCE_INSTALL_HINT}"
            )
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = self.suffix_decoding_max_tree_depth
            logger.warning(
                "Defaulted num_speculative_tokens to %s for suffix decoding.",
                self.num_speculative_tokens,
            )
        for name, ok, rule in (
            ("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth >= 1, ">= 1"),
            (
                "suffix_decoding_max_cached_requests",
                self.suffix_decoding_max_cached_requests >= 0,
                ">= 0",
            ),
            ("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor >= 0, ">= 0"),
            (
                "suffix_decoding_min_token_prob",
                0 <= self.suffix_decoding_min_token_prob <= 1,
                "in [0, 1]",
            ),
        ):
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)} must be {rule}")

    # ---- draft model ----------------------------------------------------------
    def _resolve_draft_model(self) -> None:
        """Load the draft checkpoint's config and resolve what depends on it."""
        from vllm.config.spec_draft import (
            build_draft_model_config,
            create_draft_parallel_config,
            detect_method,
            override_draft_max_model_len,
            resolve_eagle_draft,
            verify_and_get_draft_tp,
        )

        target = self.target_model_config
        if target is None or self.target_parallel_config is None:
            raise ValueError(
                f"speculative_config.method={self.method!r} with model={self.model!r} needs "
                "the target's model and parallel configs (the engine passes them)."
            )
        assert self.model is not None
        draft = build_draft_model_config(
            self.model, target, self.revision, self.quantization, self.use_heterogeneous_vocab
        )
        self.draft_model_config = draft
        self.method = detect_method(self.method or "draft_model", draft, get_args(MTPModelTypes))
        if self.method in ("dflash", "dspark"):
            self.parallel_drafting = True
        n_predict = getattr(draft.hf_config, "n_predict", None)
        if n_predict is not None:
            if self.num_speculative_tokens is None:
                self.num_speculative_tokens = int(n_predict)
            elif self.num_speculative_tokens > n_predict and (
                self.num_speculative_tokens % n_predict != 0
            ):
                raise ValueError(
                    f"num_speculative_tokens:{self.num_speculative_tokens}"
                    f" must be divisible by {n_predict=}"
                )
        if self.num_speculative_tokens is None:
            raise ValueError(
                "A speculative model was provided, but `num_speculative_tokens` was not provided"
            )
        if self.dspark_draft_topk is not None and self.method != "dspark":
            raise ValueError("dspark_draft_topk is only supported by DSpark")
        self.draft_tensor_parallel_size = verify_and_get_draft_tp(
            self.target_parallel_config, self.draft_tensor_parallel_size, draft.hf_config
        )
        draft.max_model_len = override_draft_max_model_len(
            self.max_model_len, draft.max_model_len, target.max_model_len
        )
        self.draft_parallel_config = create_draft_parallel_config(
            self.target_parallel_config, self.draft_tensor_parallel_size
        )
        if self.method in ("eagle", "eagle3"):
            resolve_eagle_draft(
                self.method,
                draft,
                target,
                self.draft_tensor_parallel_size,
                self.target_parallel_config.tensor_parallel_size,
            )

    # ---- whole-config checks (upstream: _verify_args) -------------------------
    def _verify_args(self) -> None:
        if self.tensor_parallel_size is not None:
            raise ValueError(
                "'tensor_parallel_size' is not a valid argument in the speculative_config. "
                "Please pass 'draft_tensor_parallel_size' instead."
            )
        if self.num_speculative_tokens is None:
            raise ValueError(
                "num_speculative_tokens must be provided with speculative model unless the "
                "draft model config contains an n_predict parameter."
            )
        if self.num_speculative_tokens <= 0:
            raise ValueError(
                "Expected num_speculative_tokens to be greater than zero "
                f"({self.num_speculative_tokens})."
            )
        self._verify_synthetic_rates()
        if self.use_heterogeneous_vocab and not self.uses_draft_model():
            raise ValueError("use_heterogeneous_vocab only works with method='draft_model'")
        if self.use_heterogeneous_vocab and self.draft_sample_method != "greedy":
            raise ValueError(
                "use_heterogeneous_vocab currently only supports greedy draft sampling. "
                "Set draft_sample_method='greedy' (the default) or omit it."
            )
        if not self.use_heterogeneous_vocab:
            self.verify_equal_vocab_size_if_draft_model()
        self.verify_equal_tp_if_draft_model()

    def _verify_synthetic_rates(self) -> None:
        from vllm.config.spec_draft import resolve_synthetic_acceptance_rates

        assert self.num_speculative_tokens is not None
        if self.rejection_sample_method == "synthetic":
            self.synthetic_acceptance_rates = resolve_synthetic_acceptance_rates(
                self.num_speculative_tokens,
                self.synthetic_acceptance_rates,
                self.synthetic_acceptance_length,
            )
            self.synthetic_acceptance_length = None
        elif (
            self.synthetic_acceptance_rates is not None
            or self.synthetic_acceptance_length is not None
        ):
            raise ValueError(
                "synthetic_acceptance_rates / synthetic_acceptance_length are only valid "
                "with rejection_sample_method='synthetic'."
            )

    def verify_equal_vocab_size_if_draft_model(self) -> None:
        target, draft = self.target_model_config, self.draft_model_config
        if self.method != "draft_model" or target is None or draft is None:
            return
        target_vocab, draft_vocab = target.get_vocab_size(), draft.get_vocab_size()
        if target_vocab != draft_vocab:
            raise ValueError(
                "Target and draft model should have the same vocabulary size. "
                f"Target model vocab_size={target_vocab}. "
                f"Draft model vocab_size={draft_vocab}. "
                "Using models with different tokenizers can cause out-of-bounds "
                "errors during speculative decoding."
            )

    def verify_equal_tp_if_draft_model(self) -> None:
        """A draft model shards over the target's tensor-parallel group
        (upstream's DraftModelProposer check, made here at start-up)."""
        target, draft = self.target_parallel_config, self.draft_parallel_config
        if self.method != "draft_model" or target is None or draft is None:
            return
        draft_tp, target_tp = draft.tensor_parallel_size, target.tensor_parallel_size
        if draft_tp != target_tp:
            raise ValueError(
                "Currently, 'draft_tensor_parallel_size' and 'tensor_parallel_size' must be "
                f"the same. Got {draft_tp} and {target_tp}. Please pass "
                "'draft_tensor_parallel_size' in the speculative_config."
            )

    # ---- queries (upstream's names) -------------------------------------------
    def use_eagle(self) -> bool:
        """Drafting from the target's hidden states (EAGLE, MTP, DFlash, DSpark)."""
        return self.method in ("eagle", "eagle3", "mtp", "dflash", "dspark")

    def use_dflash(self) -> bool:
        return self.method == "dflash"

    def use_dspark(self) -> bool:
        return self.method == "dspark"

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    def uses_extract_hidden_states(self) -> bool:
        return self.method == "extract_hidden_states"

    def use_ngram_gpu(self) -> bool:
        return self.method == "ngram_gpu"

    def uses_dynamic_speculative_decoding(self) -> bool:
        return self.num_speculative_tokens_per_batch_size is not None

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Extra KV slots per request a drafting step needs beyond the one
        query slot the scheduler already counts (K = num_speculative_tokens):
        DFlash K; parallel drafting K with a draft model (PARD), else K - 1;
        a sequential draft model 1; EAGLE / MTP / n-gram 0."""
        k = self.num_speculative_tokens
        assert k is not None
        if self.use_dflash():
            return k
        if self.parallel_drafting:
            return k if self.uses_draft_model() else k - 1
        return 1 if self.uses_draft_model() else 0

    def __repr__(self) -> str:
        method = self.method
        draft = self.draft_model_config
        model = (
            None
            if method in ("ngram", "suffix", "extract_hidden_states", "custom_class")
            else (draft.model if draft is not None else self.model)
        )
        num_spec_tokens = self.num_speculative_tokens
        return f"SpeculativeConfig({method=}, {model=}, {num_spec_tokens=})"


def _speculative_methods() -> set[str]:
    """Every name `method` accepts (the Literal flattened)."""
    out: set[str] = set()
    stack: list[Any] = [SpeculativeMethod]
    while stack:
        for arg in get_args(stack.pop()):
            if isinstance(arg, str):
                out.add(arg)
            else:
                stack.append(arg)
    return out


def _is_custom_proposer_path(model: str | None) -> bool:
    """True if `model` is a dotted import path such as `pkg.MyProposer`."""
    if model is None or model.startswith(("http://", "https://", "file://")) or "/" in model:
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)
