"""Plays the V1 model runner's part around a loaded model, on CPU.

It does what the runner does: find the attention layers through
`static_forward_context`, allocate one paged KV tensor per layer from the
backend's shape, bind it (`layer.kv_cache = [t]`), hand out blocks from a
shuffled free list (so a request's blocks are never contiguous), build
metadata with the backend's builder and run the model under
`set_forward_context`.
"""

from __future__ import annotations

import torch

from vllm.forward_context import set_forward_context
from vllm.utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata


class PagedHarness:
    def __init__(self, model, vllm_config, num_blocks: int = 64, seed: int = 0):
        self.model, self.vllm_config = model, vllm_config
        layers = vllm_config.compilation_config.static_forward_context
        assert layers, "the model registered no attention layer"
        self.layer_names = list(layers)
        for layer in layers.values():
            spec = layer.get_kv_cache_spec(vllm_config)
            backend = layer.get_attn_backend()
            shape = backend.get_kv_cache_shape(
                num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size
            )
            layer.kv_cache = [torch.zeros(shape, dtype=spec.dtype)]
        self.block_size = spec.block_size
        self.builder = backend.get_builder_cls()(
            spec, self.layer_names, vllm_config, torch.device("cpu")
        )
        gen = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(num_blocks, generator=gen).tolist()
        self.blocks: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def _ensure_blocks(self, req_id: str, num_tokens: int) -> None:
        blocks = self.blocks.setdefault(req_id, [])
        while len(blocks) < cdiv(num_tokens, self.block_size):
            blocks.append(self.free_blocks.pop())

    def _common_metadata(self, batch: list[tuple[str, list[int]]]) -> CommonAttentionMetadata:
        qlens, seq_lens, slots = [], [], []
        for req_id, tokens in batch:
            start = self.num_computed.get(req_id, 0)
            end = start + len(tokens)
            self._ensure_blocks(req_id, end)
            blocks = self.blocks[req_id]
            slots += [
                blocks[p // self.block_size] * self.block_size + p % self.block_size
                for p in range(start, end)
            ]
            qlens.append(len(tokens))
            seq_lens.append(end)
        width = max(len(self.blocks[r]) for r, _ in batch)
        table = torch.zeros(len(batch), width, dtype=torch.int32)
        for i, (req_id, _) in enumerate(batch):
            table[i, : len(self.blocks[req_id])] = torch.tensor(self.blocks[req_id])
        qsl = torch.tensor([0] + qlens, dtype=torch.int32).cumsum(0).to(torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        return CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens=seq,
            seq_lens_cpu=seq,
            num_computed_tokens_cpu=seq - torch.tensor(qlens, dtype=torch.int32),
            num_reqs=len(batch),
            num_actual_tokens=sum(qlens),
            max_query_len=max(qlens),
            max_seq_len=max(seq_lens),
            block_table_tensor=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
        )

    @torch.inference_mode()
    def step(self, batch: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run one step: batch = [(req_id, new token ids)], decodes first.
        Returns each request's logits for its new tokens ([n_new, vocab])."""
        cm = self._common_metadata(batch)
        md = self.builder.build(common_prefix_len=0, common_attn_metadata=cm)
        input_ids = torch.tensor([t for _, toks in batch for t in toks])
        positions = torch.cat(
            [
                torch.arange(self.num_computed.get(r, 0), self.num_computed.get(r, 0) + len(toks))
                for r, toks in batch
            ]
        )
        with set_forward_context({name: md for name in self.layer_names}, self.vllm_config):
            hidden = self.model(input_ids, positions)
        logits = self.model.compute_logits(hidden)
        out, start = [], 0
        for req_id, toks in batch:
            out.append(logits[start : start + len(toks)])
            start += len(toks)
            self.num_computed[req_id] = self.num_computed.get(req_id, 0) + len(toks)
        return out
