"""The draft-model half of `SpeculativeConfig` (upstream keeps it in
vllm/config/speculative.py): the draft's own `ModelConfig`, method detection
from the checkpoint, the draft's tensor-parallel size and max_model_len, and
the synthetic rejection-sampling rates."""

from __future__ import annotations

import copy
from typing import Any

from vllm.config.model import ModelConfig
from vllm.config.parallel import ParallelConfig
from vllm.logger import init_logger

logger = init_logger(__name__)


def build_draft_model_config(
    model: str,
    target: ModelConfig,
    revision: str | None,
    quantization: str | None,
    use_heterogeneous_vocab: bool,
) -> ModelConfig:
    """The draft checkpoint's `ModelConfig`, sharing the target's tokenizer
    (or its own with `use_heterogeneous_vocab`), dtype, seed and limits. Its
    max_model_len is derived from the checkpoint here and clipped later."""
    return ModelConfig(
        model=model,
        tokenizer=model if use_heterogeneous_vocab else target.tokenizer,
        tokenizer_mode=target.tokenizer_mode,
        trust_remote_code=target.trust_remote_code,
        dtype=target.dtype,
        seed=target.seed,
        revision=revision,
        max_model_len=-1,
        quantization=quantization,
        enforce_eager=target.enforce_eager,
        max_logprobs=target.max_logprobs,
        runner="generate",
    )


def detect_method(method: str, draft: ModelConfig, mtp_model_types: tuple[str, ...]) -> str:
    """Upstream's detection: an explicit eagle / eagle3 / dflash / dspark is
    kept; otherwise the checkpoint's name or model_type decides; a plain
    checkpoint stays `draft_model`."""
    name = draft.model.lower()
    model_type = getattr(draft.hf_config, "model_type", None)
    if method in ("eagle", "eagle3", "dflash", "dspark"):
        return method
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    if "dflash" in name:
        return "dflash"
    if "dspark" in name:
        return "dspark"
    if model_type in ("medusa", "mlp_speculator"):
        return str(model_type)
    if model_type in mtp_model_types:
        return "mtp"
    if method == "draft_model":
        return method
    raise NotImplementedError(f"Unsupported speculative method: '{method}'")


def verify_and_get_draft_tp(
    target_parallel_config: ParallelConfig, draft_tp: int | None, draft_hf_config: Any
) -> int:
    """Unset: the target's TP (1 for mlp_speculator); set: 1 or the target's."""
    target_tp = target_parallel_config.tensor_parallel_size
    if draft_tp is None:
        if getattr(draft_hf_config, "model_type", None) == "mlp_speculator":
            return 1
        return target_tp
    if draft_tp not in (1, target_tp):
        raise ValueError(
            f"speculative_draft_tensor_parallel_size={draft_tp} cannot be "
            "other value than 1 or target model tensor_parallel_size"
        )
    return draft_tp


def override_draft_max_model_len(
    speculative_max_model_len: int | None, draft_max_model_len: int, target_max_model_len: int
) -> int:
    """The given max_model_len if it fits both models, else the smaller of the two."""
    if speculative_max_model_len is not None:
        for name, bound in (
            ("draft_max_model_len", draft_max_model_len),
            ("target_max_model_len", target_max_model_len),
        ):
            if speculative_max_model_len > bound:
                raise ValueError(
                    f"speculative_max_model_len={speculative_max_model_len} cannot be "
                    f"larger than {name}={bound}"
                )
        return speculative_max_model_len
    result = min(draft_max_model_len, target_max_model_len)
    if result != draft_max_model_len:
        logger.info(
            "Overriding draft model max model len from %d to %d", draft_max_model_len, result
        )
    return result


def create_draft_parallel_config(target: ParallelConfig, draft_tp: int) -> ParallelConfig:
    """The target's parallel config with the draft's tensor-parallel size."""
    return ParallelConfig(
        tensor_parallel_size=draft_tp,
        pipeline_parallel_size=target.pipeline_parallel_size,
        distributed_executor_backend=target.distributed_executor_backend,
    )


def resolve_synthetic_acceptance_rates(
    n: int, rates: list[float] | None, length: float | None
) -> list[float]:
    """Per-position unconditional acceptance rates from exactly one of `rates`
    (length n, each in [0, 1], non-increasing) or a mean acceptance `length`
    in [1, n + 1] (the minimum-variance schedule: ones, one fraction, zeros)."""
    if (rates is None) == (length is None):
        raise ValueError(
            "rejection_sample_method='synthetic' requires exactly one of "
            "synthetic_acceptance_rates or synthetic_acceptance_length."
        )
    if rates is not None:
        if len(rates) != n:
            raise ValueError(f"synthetic_acceptance_rates must have length {n}, got {rates}.")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, n)):
            raise ValueError(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return list(rates)
    assert length is not None
    if not 1.0 <= length <= float(n + 1):
        raise ValueError(f"synthetic_acceptance_length must be in [1, {n + 1}], got {length}.")
    accepted = length - 1  # expected number of accepted draft tokens
    full = int(accepted)
    return ([1.0] * full + [accepted - full] + [0.0] * (n - full - 1))[:n]


def eagle_architectures(method: str, architectures: list[str]) -> list[str]:
    """Upstream's EAGLEConfig renaming of a draft checkpoint's architectures:
    eagle -> "Eagle" + arch (unless it starts with "Eagle"); eagle3 ->
    "Eagle3" + arch (unless it starts or ends with "Eagle3")."""
    if method == "eagle":
        return [a if a.startswith("Eagle") else f"Eagle{a}" for a in architectures]
    return [
        a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in architectures
    ]


def resolve_eagle_draft(
    method: str, draft: ModelConfig, target: ModelConfig, draft_tp: int, target_tp: int
) -> None:
    """Point the draft's ModelConfig at its EAGLE head class, and refuse at
    start-up what cannot run: a head architecture with no EAGLE class, a
    target whose model class cannot feed an EAGLE head (`supports_eagle` /
    `supports_eagle3`), widths that differ, a draft TP other than the
    target's."""
    from vllm.model_executor.models.registry import ModelRegistry

    renamed = eagle_architectures(method, draft.architectures)
    try:
        draft._model_info, draft._architecture = ModelRegistry.inspect_model_cls(renamed, draft)
    except ValueError:
        raise ValueError(
            f"speculative_config.method={method!r}: the draft checkpoint {draft.model!r} "
            f"declares architectures {draft.architectures} (as an {method} head: {renamed}); "
            f"no {method} head is built for them."
        ) from None
    # get_config caches the checkpoint's config per path: rename a copy.
    draft.hf_config = copy.deepcopy(draft.hf_config)
    get_text = getattr(draft.hf_config, "get_text_config", None)
    draft.hf_text_config = get_text() if get_text else draft.hf_config
    draft.architectures = renamed
    draft.hf_config.architectures = renamed
    # The head sees the target's positions: its rotary cache must cover them.
    head_positions = getattr(draft.hf_config, "max_position_embeddings", None)
    if head_positions is not None and head_positions < target.max_model_len:
        logger.info(
            "Overriding draft model max_position_embeddings from %d to the target model's "
            "max_model_len (%d); EAGLE drafts share the target's positional space.",
            head_positions,
            target.max_model_len,
        )
        draft.hf_config.max_position_embeddings = target.max_model_len
    target_cls, target_arch = ModelRegistry.resolve_model_cls(target.architectures, target)
    flag = "supports_eagle3" if method == "eagle3" else "supports_eagle"
    if not getattr(target_cls, flag, False):
        raise ValueError(
            f"speculative_config.method={method!r} is not supported for the target "
            f"architecture {target_arch!r} ({target_cls.__name__} cannot feed an {method} "
            "head its hidden states)."
        )
    target_hidden = target.get_hidden_size()
    head_hidden = getattr(draft.hf_config, "target_hidden_size", None) or draft.get_hidden_size()
    if head_hidden != target_hidden:
        raise ValueError(
            f"The {method} head {draft.model!r} expects target hidden size {head_hidden}, "
            f"but the target's is {target_hidden}."
        )
    if draft_tp != target_tp:
        raise NotImplementedError(
            f"{method} with draft_tensor_parallel_size={draft_tp} != tensor_parallel_size="
            f"{target_tp} is not supported; leave draft_tensor_parallel_size unset."
        )
