"""The shared body of the model-based drafters (upstream:
vllm/v1/spec_decode/llm_base_proposer.py `SpecDecodeBaseProposer`; this is a
compact design of our own over the V1 runner's `ProposerInputs`).

The drafter's model lives beside the target: its attention layers register in
the same static forward context under their own prefix ("draft_model." for a
draft model), so the runner's `get_kv_cache_spec` / `initialize_kv_cache` give
them KV cache tensors in the target's KV cache group(s). Draft and target
share block ids: block b of a draft layer holds the draft's K/V of the tokens
block b of the target holds, so the prefix cache serves both.

One `propose` call after a step's bookkeeping, for a row b with
c = num_computed_tokens[b] (the step's first position), s scheduled tokens and
N = num_tokens_no_spec[b] known tokens after the step:

  pass 1   the draft model runs over the row's real tokens of this step,
           positions c .. N-1 for a row that emitted a token (its input tokens
           that were accepted, then the emitted one), c .. c+s-1 for a row
           still mid-prefill: every real token passes through the draft once,
           so the draft's KV cache stays complete (prefill chunks included).
           The hidden state at the last position gives draft 1 (greedy).
  pass j   (j = 1..k-1) one token per drafting row: draft j at position
           N+j-1; its hidden state gives draft j+1. The scheduler allocated
           k lookahead slots, so positions up to N+k-2 have slots.
  (EAGLE, first_pass_token_offset = 1: pass 1 feeds token p+1 at position p,
  so it ends at N-2 and draft j goes at N+j-2.)

Example, k = 3: a decode row with c = 10 ran [t0, d1, d2, d3] (s = 4) and
accepted d1 only, emitting e at position 12, so N = 13. Pass 1 runs
[t0, d1, e] at positions 10, 11, 12; pass 2 runs x1 at 13; pass 3 x2 at 14;
drafts [x1, x2, x3]. (Draft K/V of rejected tokens at 12.. are overwritten.)

Greedy drafts carry no probabilities (draft_probs None): the rejection
sampler then treats each draft as a one-hot proposal, still lossless.

Subclasses (DraftModelProposer, EagleProposer) choose the model and shape its
inputs through the hooks `_get_model`, `first_pass_token_offset`,
`_first_pass_model_kwargs`, `_split_model_output`, `_next_pass_model_kwargs`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.worker.utils import (
    CpuGpuBuffer,
    as_text_generation_model,
    build_group_attn_metadata,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.spec_decode.proposer_inputs import ProposerInputs
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup

logger = init_logger(__name__)


@dataclass
class FirstPassPlan:
    """Pass 1's tokens, row after row in batch order (rows without a token
    this step are left out).

    For rows = [0, 2] with 3 and 1 tokens:
        positions = [c0, c0+1, c0+2, c2]   query_start_loc = [0, 3, 4]
    """

    rows: np.ndarray  # [R] int64: batch rows in pass order
    query_start_loc: np.ndarray  # [R + 1] int32
    positions: np.ndarray  # [T] int64
    token_ids: np.ndarray  # [T] int32: token at position + first_pass_token_offset
    # [T] int64: the row of ProposerInputs.hidden_states (the target's step
    # order) of each token's position; clamped into range where the position
    # lies past the step's inputs (the emitted token: no target hidden state).
    step_token_index: np.ndarray
    seq_lens: np.ndarray  # [R] int32: last position + 1


class SpecDecodeBaseProposer:
    """Loads the drafter model and drafts k tokens per row greedily."""

    # Pass 1 feeds token[p + offset] at position p: 0 for a draft model, 1 for
    # EAGLE (whose head reads the target's hidden state of position p).
    first_pass_token_offset = 0

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        pass_hidden_states_to_model: bool,
        runner: Any = None,
    ) -> None:
        spec = vllm_config.speculative_config
        if spec is None or vllm_config.model_config is None:
            raise ValueError("A drafter needs a speculative_config and a model_config.")
        self.vllm_config = vllm_config
        self.speculative_config: SpeculativeConfig = spec
        self.device = device
        self.runner = runner
        self.pass_hidden_states_to_model = pass_hidden_states_to_model
        self._refuse_unbuilt_options(spec)
        self.num_speculative_tokens = int(spec.num_speculative_tokens or 0)
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self.model: nn.Module | None = None
        self._draft_attn_layer_names: set[str] = set()
        # (KV cache group id, its attention groups) holding draft layers.
        self._draft_groups: list[tuple[int, list[AttentionGroup]]] | None = None
        sched = vllm_config.scheduler_config
        # Pass 1 runs at most the step's tokens plus one emitted token per row.
        max_tokens = sched.max_num_batched_tokens + sched.max_num_seqs
        pin = device.type != "cpu" and torch.cuda.is_available()

        def buffer(size: int, dtype: torch.dtype) -> CpuGpuBuffer:
            return CpuGpuBuffer(size, dtype=dtype, device=device, pin_memory=pin)

        self._input_ids = buffer(max_tokens, torch.int32)
        self._positions = buffer(max_tokens, torch.int64)
        self._slot_mapping = buffer(max_tokens, torch.int64)
        self._query_start_loc = buffer(sched.max_num_seqs + 1, torch.int32)
        self._seq_lens = buffer(sched.max_num_seqs, torch.int32)

    @staticmethod
    def _refuse_unbuilt_options(spec: SpeculativeConfig) -> None:
        """Drafter options this build does not implement, refused by name."""
        unbuilt = {
            "draft_sample_method": spec.draft_sample_method != "greedy",
            "parallel_drafting": spec.parallel_drafting,
            "attention_backend": spec.attention_backend is not None,
            "kv_cache_dtype": spec.kv_cache_dtype is not None,
            "moe_backend": spec.moe_backend is not None,
        }
        named = [name for name, is_set in unbuilt.items() if is_set]
        if named:
            raise NotImplementedError(
                f"speculative_config {', '.join(named)} is not supported with method "
                f"{spec.method!r} here (drafts are greedy, one token per pass, with the "
                "target's attention backend and KV cache dtype)."
            )

    # ---- loading -----------------------------------------------------------------
    def _create_draft_vllm_config(self) -> VllmConfig:
        """The target's config with the draft's model config. A shallow copy:
        the compilation config (its static forward context, where attention
        layers register) stays shared with the target."""
        from vllm.config.vllm import VllmConfig

        draft_model_config = self.speculative_config.draft_model_config
        if draft_model_config is None:
            raise ValueError(f"Method {self.speculative_config.method!r} has no draft model.")
        config = copy.copy(self.vllm_config)
        config.model_config = draft_model_config
        config.quant_config = VllmConfig._get_quantization_config(
            draft_model_config, self.vllm_config.device_config.device_type
        )
        config.lora_config = None
        if self.speculative_config.draft_load_config is not None:
            config.load_config = self.speculative_config.draft_load_config
        config.speculative_config = None
        return config

    def _get_model(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define _get_model().")

    def load_model(self, target_model: nn.Module) -> None:
        """Build the drafter's model, then find its attention layers (those
        it added to the static forward context) and check that they fit the
        target's KV cache pages."""
        static_ctx = self.vllm_config.compilation_config.static_forward_context
        target_layer_names = set(static_ctx)
        self.model = self._get_model()
        self._draft_attn_layer_names = {
            name
            for name, layer in static_ctx.items()
            if name not in target_layer_names and layer.get_kv_cache_spec(self.vllm_config)
        }
        self._check_kv_cache_specs(target_layer_names)
        self._maybe_share_embeddings(target_model)
        self._maybe_share_lm_head(target_model)

    def _check_kv_cache_specs(self, target_layer_names: set[str]) -> None:
        """The draft's layers must share the target's KV cache group: one block
        table, one page shape. Different shapes would need several KV cache
        groups in one block pool, which the KV cache planning here does not build."""
        static_ctx = self.vllm_config.compilation_config.static_forward_context

        def shape(name: str) -> tuple[Any, ...]:
            spec = static_ctx[name].get_kv_cache_spec(self.vllm_config)
            fields = ("block_size", "num_kv_heads", "head_size", "dtype")
            return (type(spec).__name__, *(getattr(spec, f, None) for f in fields))

        target_shapes = {
            shape(n)
            for n in target_layer_names
            if static_ctx[n].get_kv_cache_spec(self.vllm_config)
        }
        draft_shapes = {shape(n) for n in self._draft_attn_layer_names}
        if len(target_shapes | draft_shapes) > 1:
            fmt = "(kind, block_size, num_kv_heads, head_size, dtype)"
            raise NotImplementedError(
                f"speculative method {self.speculative_config.method!r}: the draft model's KV "
                f"cache pages {sorted(map(str, draft_shapes))} differ from the target's "
                f"{sorted(map(str, target_shapes))} {fmt}. Draft layers must share the "
                "target's KV cache group (same num_key_value_heads and head_dim); several "
                "KV cache groups of different page shapes are not supported."
            )

    def _maybe_share_embeddings(self, target_model: nn.Module) -> None:
        """EAGLE heads without their own embedding take the target's."""

    def _maybe_share_lm_head(self, target_model: nn.Module) -> None:
        """EAGLE heads without their own LM head take the target's."""

    # ---- model hooks ---------------------------------------------------------------
    def _first_pass_model_kwargs(
        self, plan: FirstPassPlan, inputs: ProposerInputs
    ) -> dict[str, torch.Tensor]:
        return {}

    def _split_model_output(self, output: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states for the logits [T, H], what the next pass carries [T, H])."""
        return output, output

    def _next_pass_model_kwargs(self, carry: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    # ---- proposing -----------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, inputs: ProposerInputs) -> list[list[int]]:
        """k greedy drafts for every row that needs them ([] for the others);
        runs pass 1 over every row's real tokens of the step regardless."""
        num_reqs = len(inputs.req_ids)
        drafts: list[list[int]] = [[] for _ in range(num_reqs)]
        if num_reqs == 0:
            return drafts
        batch = inputs.input_batch
        plan = self.plan_first_pass(inputs)
        if plan.rows.size == 0:
            return drafts
        output = self._run(
            plan, batch, inputs.attn_groups, self._first_pass_model_kwargs(plan, inputs)
        )
        hidden, carry = self._split_model_output(output)

        # Rows that draft, and how many tokens each may draft (positions stay
        # below max_model_len).
        num_known = batch.num_tokens_no_spec[plan.rows].astype(np.int64)
        wants = inputs.needs_draft[plan.rows]
        budget = np.minimum(self.num_speculative_tokens, self.max_model_len - num_known)
        sel = np.flatnonzero(wants & (budget > 0))
        if sel.size == 0:
            return drafts
        last = torch.from_numpy(plan.query_start_loc[1:][sel].astype(np.int64) - 1)
        hidden, carry = hidden[last.to(hidden.device)], carry[last.to(carry.device)]
        rows, budget, num_known = plan.rows[sel], budget[sel], num_known[sel]
        for j in range(1, self.num_speculative_tokens + 1):
            tokens = self._greedy(hidden).cpu().numpy()
            for row, token in zip(rows.tolist(), tokens.tolist()):
                drafts[row].append(token)
            active = np.flatnonzero(budget > j)
            if active.size == 0 or j == self.num_speculative_tokens:
                break
            idx = torch.from_numpy(active).to(carry.device)
            rows, budget, num_known = rows[active], budget[active], num_known[active]
            # Pass 1 ended at position num_known - 1 - offset; draft j follows it.
            last_position = num_known - 1 - self.first_pass_token_offset
            step = self._single_token_plan(rows, tokens[active], last_position + j)
            output = self._run(
                step, batch, inputs.attn_groups, self._next_pass_model_kwargs(carry[idx])
            )
            hidden, carry = self._split_model_output(output)
        return drafts

    def plan_first_pass(self, inputs: ProposerInputs) -> FirstPassPlan:
        """Pass 1's layout (see the module docstring), vectorised over rows."""
        batch = inputs.input_batch
        n = len(inputs.req_ids)
        off = self.first_pass_token_offset
        start = inputs.num_computed_tokens[:n].astype(np.int64)
        scheduled = inputs.num_scheduled_tokens[:n].astype(np.int64)
        known = batch.num_tokens_no_spec[:n].astype(np.int64)
        # A row that emitted runs up to its last known token; any other only
        # the step's tokens that were real (a mid-prefill chunk).
        end = np.where(
            inputs.needs_draft[:n], known - off, np.minimum(start + scheduled, known - off)
        )
        counts = np.maximum(end - start, 0)
        rows = np.flatnonzero(counts > 0)
        counts = counts[rows]
        qsl = np.zeros(rows.size + 1, dtype=np.int32)
        np.cumsum(counts, out=qsl[1:])
        total = int(qsl[-1])
        row_of_token = np.repeat(rows, counts)
        offsets = np.arange(total, dtype=np.int64) - np.repeat(qsl[:-1].astype(np.int64), counts)
        positions = start[row_of_token] + offsets
        token_ids = batch.token_ids_cpu[row_of_token, positions + off].astype(np.int32)
        step_start = np.concatenate(([0], np.cumsum(scheduled)[:-1]))
        step_token_index = step_start[row_of_token] + offsets
        np.minimum(step_token_index, max(int(scheduled.sum()) - 1, 0), out=step_token_index)
        seq_lens = (start[rows] + counts).astype(np.int32)
        return FirstPassPlan(rows, qsl, positions, token_ids, step_token_index, seq_lens)

    @staticmethod
    def _single_token_plan(
        rows: np.ndarray, tokens: np.ndarray, positions: np.ndarray
    ) -> FirstPassPlan:
        n = rows.size
        return FirstPassPlan(
            rows=rows,
            query_start_loc=np.arange(n + 1, dtype=np.int32),
            positions=positions.astype(np.int64),
            token_ids=tokens.astype(np.int32),
            step_token_index=np.zeros(n, dtype=np.int64),
            seq_lens=(positions + 1).astype(np.int32),
        )

    def _run(
        self,
        plan: FirstPassPlan,
        batch: InputBatch,
        attn_groups: list[list[AttentionGroup]],
        model_kwargs: dict[str, torch.Tensor],
    ) -> Any:
        """One forward of the drafter over `plan`'s tokens (its own buffers;
        the runner's input buffers are left as they are)."""
        assert self.model is not None, "load_model() has not run"
        num_tokens = plan.positions.size
        # Safe to rewrite the pinned host buffers: the previous pass's copies
        # were consumed before its drafts came back to the host (.cpu() syncs).
        self._input_ids.np[:num_tokens] = plan.token_ids
        self._positions.np[:num_tokens] = plan.positions
        attn_metadata = self._build_attn_metadata(plan, batch, attn_groups)
        input_ids = self._input_ids.copy_to_gpu(num_tokens)
        positions = self._positions.copy_to_gpu(num_tokens)
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_tokens):
            return self.model(input_ids=input_ids, positions=positions, **model_kwargs)

    def _build_attn_metadata(
        self, plan: FirstPassPlan, batch: InputBatch, attn_groups: list[list[AttentionGroup]]
    ) -> dict[str, object]:
        """Metadata for the KV cache groups holding draft layers: the rows'
        block tables (shared with the target) and slots for `plan`'s tokens."""
        num_reqs, num_tokens = plan.rows.size, plan.positions.size
        self._query_start_loc.np[: num_reqs + 1] = plan.query_start_loc
        self._seq_lens.np[:num_reqs] = plan.seq_lens
        qsl = self._query_start_loc.copy_to_gpu(num_reqs + 1)
        seq_lens = self._seq_lens.copy_to_gpu(num_reqs)
        query_lens = np.diff(plan.query_start_loc)
        rows_t = torch.from_numpy(plan.rows)
        out: dict[str, object] = {}
        for gid, groups in self._groups_with_draft_layers(attn_groups):
            table = batch.block_table[gid]
            row_of_token = np.repeat(plan.rows, query_lens)
            block_numbers = table.get_numpy_array()[
                row_of_token, plan.positions // table.block_size
            ]
            slots = self._slot_mapping.np[:num_tokens]
            np.multiply(block_numbers, table.block_size, out=slots, dtype=np.int64)
            slots += plan.positions % table.block_size
            device_table = table.get_device_tensor(batch.num_reqs)
            common = CommonAttentionMetadata(
                query_start_loc=qsl,
                query_start_loc_cpu=self._query_start_loc.cpu[: num_reqs + 1],
                seq_lens=seq_lens,
                seq_lens_cpu=self._seq_lens.cpu[:num_reqs],
                num_computed_tokens_cpu=torch.from_numpy(plan.seq_lens - query_lens),
                num_reqs=num_reqs,
                num_actual_tokens=num_tokens,
                max_query_len=int(query_lens.max()),
                max_seq_len=int(plan.seq_lens.max()),
                block_table_tensor=device_table[rows_t.to(device_table.device)],
                slot_mapping=self._slot_mapping.copy_to_gpu(num_tokens),
            )
            build_group_attn_metadata(groups, common, False, out)
        return out

    def _groups_with_draft_layers(
        self, attn_groups: list[list[AttentionGroup]]
    ) -> list[tuple[int, list[AttentionGroup]]]:
        """The runner's KV cache groups that hold draft layers (found once)."""
        if self._draft_groups is None:
            found = []
            covered: set[str] = set()
            for gid, groups in enumerate(attn_groups):
                names = {n for g in groups for n in g.layer_names} & self._draft_attn_layer_names
                if names:
                    found.append((gid, groups))
                    covered |= names
            missing = self._draft_attn_layer_names - covered
            if missing:
                raise RuntimeError(
                    f"Draft attention layers {sorted(missing)} are in no KV cache group; "
                    "the runner's KV cache was initialised before the drafter loaded."
                )
            self._draft_groups = found
        return self._draft_groups

    def _greedy(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[R] int64: the draft's argmax token of each row (its vocab padding dropped)."""
        assert self.model is not None
        logits = as_text_generation_model(self.model).compute_logits(hidden_states)
        return logits[:, : self.vocab_size].argmax(dim=-1)
