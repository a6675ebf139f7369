"""Speculative decoding with a small draft model (upstream:
vllm/v1/spec_decode/draft_model.py `DraftModelProposer`).

The draft is an ordinary causal LM with the target's vocabulary, loaded under
the layer-name prefix "draft_model" with the target's tensor-parallel size;
its KV cache shares the target's block pool (see llm_base_proposer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from vllm.logger import init_logger
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


class DraftModelProposer(SpecDecodeBaseProposer):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner: Any = None) -> None:
        super().__init__(
            vllm_config=vllm_config,
            device=device,
            pass_hidden_states_to_model=False,
            runner=runner,
        )
        self._raise_if_draft_tp_mismatch()
        if self.speculative_config.use_heterogeneous_vocab:
            # Upstream maps token ids between two tokenizers (VocabMapping);
            # not built here.
            raise NotImplementedError(
                "speculative_config.use_heterogeneous_vocab=True (a draft model with its own "
                "tokenizer) is not supported; use a draft model with the target's vocabulary."
            )
        self._raise_if_vocab_size_mismatch()
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise NotImplementedError(
                "draft_model speculative decoding with pipeline_parallel_size > 1 is not supported."
            )

    def _raise_if_vocab_size_mismatch(self) -> None:
        self.speculative_config.verify_equal_vocab_size_if_draft_model()

    def _raise_if_draft_tp_mismatch(self) -> None:
        # Both models shard over the same tensor-parallel group; a TP=1 draft
        # beside a TP>1 target would need a group of its own (upstream refuses too).
        self.speculative_config.verify_equal_tp_if_draft_model()

    def _get_model(self) -> nn.Module:
        from vllm.model_executor.model_loader import get_model

        draft_config = self._create_draft_vllm_config()
        logger.info("Loading draft model %s", self.speculative_config.model)
        return get_model(
            vllm_config=draft_config,
            model_config=draft_config.model_config,
            prefix="draft_model",
        )
