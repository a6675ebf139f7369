"""EAGLE / EAGLE-3 drafting on Model Runner V2 (upstream:
vllm/v1/worker/gpu/spec_decode/eagle/speculator.py `EagleSpeculator`, over
its autoregressive speculator; this is a compact design of our own).

The head is loaded, checked and wired to the target (shared embeddings /
LM head, the target's auxiliary hidden-state layers for EAGLE-3) by the V1
runner's `EagleProposer` (vllm/v1/spec_decode/eagle.py), which also shapes
the head's inputs (`_split_model_output`). Its attention layers share the
target's KV cache group and block table, so the step's attention metadata
already covers them.

After a step's sampling, for batch position i (query start q_i, s_i tokens
at positions c_i .., n_i tokens emitted, r_i drafts rejected):

  pass 1   the head runs over the step's tokens with the target's hidden
           states and attention metadata, fed the NEXT token of each position
           (EAGLE reads the target's state at p to predict p + 2 from token
           p + 1): input ids shifted left by one, and at the request's last
           accepted token (index q_i + s_i - 1 - r_i) the token it emitted
           (the next prompt token for a request still mid-prefill). Rows past
           it (rejected drafts) compute garbage K/V that later steps overwrite.
  pass j   (j = 2..k) one token per drafting request: draft j-1 at position
           P_i + j - 1, P_i = c_i + s_i - 1 - r_i the last position of pass 1,
           with the head's own output of the previous pass as hidden state.

Draft j of a request lands at position P_i + 1 + j; a request drafts at most
max_model_len - (P_i + 2) tokens (positions stay inside the model), and only
when it emitted a token this step. Drafts are greedy (argmax of the head's
logits), as the V1 EAGLE proposer's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.worker.gpu.attn_utils import build_attn_metadata
from vllm.v1.worker.utils import as_text_generation_model

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup


class EagleSpeculator:
    """Drafts k tokens per request with an EAGLE or EAGLE-3 head."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        spec = vllm_config.speculative_config
        assert spec is not None and spec.num_speculative_tokens
        self.vllm_config = vllm_config
        self.device = device
        self.num_speculative_steps = int(spec.num_speculative_tokens)
        assert vllm_config.model_config is not None
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        # Loading, checks and input shaping shared with the V1 runner.
        self.proposer = EagleProposer(vllm_config, device)
        self.model: nn.Module | None = None

    @property
    def uses_aux_hidden_states(self) -> bool:
        """EAGLE-3 heads read the target's auxiliary hidden states."""
        return self.proposer.eagle3_use_aux_hidden_state

    def load_model(self, target_model: nn.Module) -> None:
        """Load the head beside `target_model` (before the KV cache is sized,
        so its attention layers get cache tensors)."""
        self.proposer.load_model(target_model)
        self.model = self.proposer.model

    # ---- proposing -----------------------------------------------------------------
    @torch.inference_mode()
    def propose(
        self,
        batch: InputBatch,
        attn_metadata: dict[str, Any],
        hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        sampled: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected_np: np.ndarray,
        prefill_len_np: np.ndarray,
        all_token_ids: torch.Tensor,
        block_tables: BlockTables,
        attn_groups: list[list[AttentionGroup]],
    ) -> tuple[torch.Tensor, np.ndarray]:
        """(drafts [num_reqs, k] int64 on the device, per request how many of
        them are real (0 for a request that emitted nothing)); see the module
        docstring for the passes. num_rejected_np [num_reqs]: host copy of the
        step's rejected drafts; prefill_len_np: per request row."""
        k = self.num_speculative_steps
        num_reqs = batch.num_reqs
        drafts = torch.zeros(num_reqs, k, dtype=torch.int64, device=self.device)
        # A request emitted a token unless it is still mid-prefill (host-known).
        emitted_np = batch.seq_lens_np >= prefill_len_np[batch.idx_mapping_np]
        last_index = batch.query_start_loc_np[1:].astype(np.int64) - 1 - num_rejected_np
        hidden, carry = self._first_pass(
            batch,
            attn_metadata,
            hidden_states,
            aux_hidden_states,
            sampled,
            num_sampled,
            last_index,
            all_token_ids,
        )
        last_pos = (
            batch.num_computed_tokens_np.astype(np.int64)
            + last_index
            - (batch.query_start_loc_np[:-1])
        )
        budget = np.minimum(k, self.max_model_len - (last_pos + 2))
        budget = np.where(emitted_np, np.maximum(budget, 0), 0)
        sel = np.flatnonzero(budget > 0)
        if sel.size == 0:
            return drafts, budget
        index = torch.from_numpy(last_index[sel]).to(self.device)
        hidden, carry = hidden[index], carry[index]
        for j in range(1, k + 1):
            tokens = self._greedy(hidden)
            sel_t = torch.from_numpy(sel).to(self.device)
            drafts[sel_t, j - 1] = tokens
            if j == k:
                break
            active = np.flatnonzero(budget[sel] > j)
            if active.size == 0:
                break
            active_t = torch.from_numpy(active).to(self.device)
            sel, tokens, carry = sel[active], tokens[active_t], carry[active_t]
            hidden, carry = self._one_token_pass(
                batch, sel, tokens, last_pos[sel] + j, carry, block_tables, attn_groups
            )
        return drafts, budget

    def _first_pass(
        self,
        batch: InputBatch,
        attn_metadata: dict[str, Any],
        hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        sampled: torch.Tensor,
        num_sampled: torch.Tensor,
        last_index: np.ndarray,
        all_token_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the step's tokens: (hidden [T, H], carry [T, H])."""
        num_tokens = batch.num_tokens
        input_ids = batch.input_ids[:num_tokens]
        positions = batch.positions[:num_tokens]
        ids = input_ids.roll(-1)  # the last row is overwritten below or unused
        last = torch.from_numpy(last_index).to(self.device)
        # The token after each request's last accepted one: what it emitted,
        # else (mid-prefill) its next prompt token.
        emitted = sampled.gather(1, (num_sampled.to(torch.int64) - 1).clamp(min=0)[:, None])[:, 0]
        next_col = (positions[last] + 1).clamp(max=all_token_ids.shape[1] - 1)
        rows = batch.idx_mapping.to(torch.int64)
        next_prompt = all_token_ids[rows, next_col].to(torch.int64)
        ids[last] = torch.where(num_sampled > 0, emitted, next_prompt).to(ids.dtype)
        head: Any = self.model
        if self.uses_aux_hidden_states:
            if not aux_hidden_states:
                raise RuntimeError("EAGLE-3 drafting needs the target's auxiliary hidden states.")
            hidden = head.combine_hidden_states(torch.cat(aux_hidden_states, dim=-1))
        else:
            hidden = hidden_states[:num_tokens]
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_tokens):
            output = head(input_ids=ids, positions=positions, hidden_states=hidden)
        return self.proposer._split_model_output(output)

    def _one_token_pass(
        self,
        batch: InputBatch,
        sel: np.ndarray,
        tokens: torch.Tensor,
        positions_np: np.ndarray,
        carry: torch.Tensor,
        block_tables: BlockTables,
        attn_groups: list[list[AttentionGroup]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per selected batch position: `tokens` at `positions_np`."""
        n = sel.size
        device = self.device
        idx_mapping = torch.from_numpy(batch.idx_mapping_np[sel]).to(device)
        qsl_np = np.arange(n + 1, dtype=np.int32)
        qsl = torch.from_numpy(qsl_np).to(device)
        positions = torch.from_numpy(positions_np.astype(np.int64)).to(device)
        seq_lens_np = (positions_np + 1).astype(np.int32)
        tables = block_tables.gather_block_tables(idx_mapping)
        slots = block_tables.compute_slot_mappings(idx_mapping, qsl, positions)
        attn_metadata = build_attn_metadata(
            attn_groups,
            n,
            n,
            qsl,
            torch.from_numpy(qsl_np),
            torch.from_numpy(seq_lens_np).to(device),
            torch.from_numpy(seq_lens_np),
            torch.from_numpy(seq_lens_np - 1),
            max_query_len=1,
            max_seq_len=int(seq_lens_np.max()),
            block_tables=tables,
            slot_mappings=slots,
        )
        head: Any = self.model
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=n):
            output = head(
                input_ids=tokens.to(torch.int32), positions=positions, hidden_states=carry
            )
        return self.proposer._split_model_output(output)

    def _greedy(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[n] int64: the head's argmax token per row (vocab padding dropped)."""
        assert self.model is not None
        logits = as_text_generation_model(self.model).compute_logits(hidden_states)
        return logits[:, : self.vocab_size].argmax(dim=-1)
