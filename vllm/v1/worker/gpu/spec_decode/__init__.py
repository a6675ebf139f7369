"""Speculative decoding on Model Runner V2 (upstream:
vllm/v1/worker/gpu/spec_decode/): `init_speculator` builds the drafter for
the configured method, `rejection_sampler.py` verifies drafts with V2's
sampling, `utils.py` holds the drafts for the scheduler.

Built: eagle, eagle3 (eagle/speculator.py). mtp, dflash and dspark are
refused earlier by name (VllmConfig._refuse_unbuilt_speculation); ngram and
draft_model run on the V1 runner (VllmConfig routing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator


def init_speculator(vllm_config: VllmConfig, device: torch.device) -> EagleSpeculator:
    """The speculator for `vllm_config.speculative_config.method`."""
    spec = vllm_config.speculative_config
    assert spec is not None
    if spec.method in ("eagle", "eagle3"):
        from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

        return EagleSpeculator(vllm_config, device)
    raise NotImplementedError(
        f"speculative method {spec.method!r} is not supported by Model Runner V2 here "
        "(built: eagle, eagle3)."
    )
