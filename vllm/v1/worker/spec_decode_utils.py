"""Speculative decoding in the V1 model runner (upstream keeps this inside
vllm/v1/worker/gpu_model_runner.py; split out so the runner's methods stay
short).

`build_drafter` picks the drafter for the configured method; the drafter
classes are imported lazily so a runner without speculation imports none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def build_drafter(vllm_config: VllmConfig, device: torch.device, runner: Any) -> Any | None:
    """The drafter for `vllm_config.speculative_config` (None without one):
    NgramProposer for "ngram", DraftModelProposer for "draft_model",
    EagleProposer for "eagle"/"eagle3"."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    method = spec.method
    if method == "ngram":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer, NgramVllmConfigLike

        # VllmConfig.model_config is Optional; a runner always has one.
        return NgramProposer(cast(NgramVllmConfigLike, vllm_config))
    if method == "draft_model":
        from vllm.v1.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(vllm_config, device, runner)
    if method in ("eagle", "eagle3"):
        from vllm.v1.spec_decode.eagle import EagleProposer

        return EagleProposer(vllm_config, device, runner)
    raise NotImplementedError(
        f"Speculative decoding method {method!r} is not supported by the V1 model runner."
    )
