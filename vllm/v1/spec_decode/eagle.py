"""EAGLE / EAGLE-3 speculative decoding (upstream:
vllm/v1/spec_decode/eagle.py `EagleProposer`) on the shared base in
llm_base_proposer.py.

An EAGLE head drafts from the target's hidden states. Pass 1 runs, for each
position p of the step's real tokens, the NEXT token (p + 1) with the
target's hidden state of p (`first_pass_token_offset = 1`): EAGLE-1 reads the
target's last hidden states, EAGLE-3 the concatenated auxiliary states folded
by the head's fc (`combine_hidden_states`). Later passes feed each draft
token with the head's own output of the previous pass (its "carry").

The head's attention layers register under the prefix "eagle" in the
target's static forward context and share its KV cache group and blocks.
Embeddings / LM head the checkpoint lacks are the target's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from vllm.logger import init_logger
from vllm.v1.spec_decode.llm_base_proposer import FirstPassPlan, SpecDecodeBaseProposer

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.spec_decode.proposer_inputs import ProposerInputs

logger = init_logger(__name__)


class EagleProposer(SpecDecodeBaseProposer):
    first_pass_token_offset = 1

    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner: Any = None) -> None:
        super().__init__(vllm_config, device, pass_hidden_states_to_model=True, runner=runner)
        self.method = self.speculative_config.method
        if self.method not in ("eagle", "eagle3"):
            raise ValueError(f"EagleProposer drafts for eagle / eagle3, not {self.method!r}.")
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise NotImplementedError(
                f"{self.method} speculative decoding with pipeline_parallel_size > 1 "
                "is not supported."
            )
        # Upstream's flag: the target hands out its aux states (an EAGLE-3 head
        # may opt out in its eagle_config and read the last hidden states).
        self.eagle3_use_aux_hidden_state = self.method == "eagle3" and self._head_uses_aux()

    def _head_uses_aux(self) -> bool:
        draft = self.speculative_config.draft_model_config
        assert draft is not None
        eagle_config = getattr(draft.hf_config, "eagle_config", None) or {}
        return bool(eagle_config.get("use_aux_hidden_state", True))

    # ---- loading -------------------------------------------------------------------
    def _get_model(self) -> nn.Module:
        from vllm.model_executor.model_loader import get_model

        config = self._create_draft_vllm_config()
        # The head reads its own config from the speculative config.
        config.speculative_config = self.speculative_config
        logger.info("Loading %s head %s", self.method, self.speculative_config.model)
        return get_model(vllm_config=config, model_config=config.model_config, prefix="eagle")

    def load_model(self, target_model: nn.Module) -> None:
        super().load_model(target_model)
        if self.eagle3_use_aux_hidden_state:
            self._set_target_aux_layers(target_model)

    def _set_target_aux_layers(self, target_model: nn.Module) -> None:
        """Make the target return its residual stream at the head's depths
        (the draft config's eagle_aux_hidden_state_layer_ids, else the
        target's default), one per fc input chunk."""
        from vllm.model_executor.models.interfaces import supports_eagle3

        if not supports_eagle3(target_model):
            raise RuntimeError(
                f"{type(target_model).__name__} does not support EAGLE-3 "
                "(it cannot output auxiliary hidden states)."
            )
        target: Any = target_model
        head: Any = self.model
        layers = (
            self._aux_layers_from_config() or target.get_eagle3_default_aux_hidden_state_layers()
        )
        expected = head.model.num_aux_hidden_states
        # Depth d is the stream entering layer d (0 = embeddings, L = last output).
        num_layers = len(target.model.layers)
        depths = sorted(set(layers))
        if len(depths) != expected or not all(0 <= d <= num_layers for d in depths):
            raise ValueError(
                f"The EAGLE-3 head expects {expected} distinct auxiliary hidden states at "
                f"depths 0..{num_layers} of the target, got {list(layers)}; set "
                "eagle_aux_hidden_state_layer_ids in the head's config."
            )
        target.set_aux_hidden_state_layers(tuple(layers))

    def _aux_layers_from_config(self) -> tuple[int, ...] | None:
        draft = self.speculative_config.draft_model_config
        assert draft is not None
        hf_config = draft.hf_config
        ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)
        eagle_config = getattr(hf_config, "eagle_config", None)
        if not ids and isinstance(eagle_config, dict):
            ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        return tuple(int(i) for i in ids) if ids else None

    def _maybe_share_embeddings(self, target_model: nn.Module) -> None:
        from vllm.model_executor.models.llama_eagle import share_target_embeddings

        assert self.model is not None
        if share_target_embeddings(self.model, target_model):
            logger.info("The %s head shares the target's embed_tokens.", self.method)

    def _maybe_share_lm_head(self, target_model: nn.Module) -> None:
        from vllm.model_executor.models.llama_eagle import share_target_lm_head

        assert self.model is not None
        if share_target_lm_head(self.model, target_model):
            logger.info("The %s head shares the target's lm_head.", self.method)

    # ---- model hooks ---------------------------------------------------------------
    def _first_pass_model_kwargs(
        self, plan: FirstPassPlan, inputs: ProposerInputs
    ) -> dict[str, torch.Tensor]:
        """hidden_states [T, H]: the target's state at each pass-1 position
        (EAGLE-3: its aux states, concatenated [T, A*H], folded by fc)."""
        head: Any = self.model
        index = torch.from_numpy(plan.step_token_index.astype(np.int64))
        if self.eagle3_use_aux_hidden_state:
            aux = inputs.aux_hidden_states
            if not aux:
                raise RuntimeError("EAGLE-3 drafting needs the target's auxiliary hidden states.")
            index = index.to(aux[0].device)
            stacked = torch.cat([a[index] for a in aux], dim=-1)
            hidden = head.combine_hidden_states(stacked)
        else:
            hidden = inputs.hidden_states[index.to(inputs.hidden_states.device)]
        return {"hidden_states": hidden}

    def _split_model_output(self, output: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The head returns (hidden for the logits, carry for the next pass)."""
        hidden, carry = output
        return hidden, carry

    def _next_pass_model_kwargs(self, carry: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden_states": carry}
