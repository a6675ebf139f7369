"""The V1 runner's persistent input buffers and their commit to the device
(upstream: the buffers of vllm/v1/worker/gpu_model_runner.py and its
`_build_attention_metadata`; V2's counterpart is `InputBuffers` in
vllm/v1/worker/gpu/input_batch.py).

The runner (or a dummy run) lays a step out on the host side of these
buffers, in numpy; `commit` then pads the batch to the size of the CUDA graph
that runs it (vllm/v1/worker/cudagraph_padding.py), copies the used prefix to
the device and builds the attention metadata over the padded batch. The
buffers never move, so a graph captured over them replays any later step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.worker.cudagraph_padding import write_padding
from vllm.v1.worker.kv_cache_setup import is_cacheless_group
from vllm.v1.worker.utils import CpuGpuBuffer, build_group_attn_metadata

if TYPE_CHECKING:
    from vllm.v1.worker.cudagraph_padding import PaddedBatch
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup


class InputBuffers:
    """Host buffers with device twins, sized for the largest step:
    input_ids and positions [max_num_tokens], query_start_loc
    [max_num_reqs + 1], seq_lens [max_num_reqs]."""

    def __init__(
        self, max_num_reqs: int, max_num_tokens: int, device: torch.device, pin_memory: bool
    ) -> None:
        self.device = device

        def buffer(size: int, dtype: torch.dtype) -> CpuGpuBuffer:
            return CpuGpuBuffer(size, dtype=dtype, device=device, pin_memory=pin_memory)

        self.input_ids = buffer(max_num_tokens, torch.int32)
        self.positions = buffer(max_num_tokens, torch.int64)
        self.query_start_loc = buffer(max_num_reqs + 1, torch.int32)
        self.seq_lens = buffer(max_num_reqs, torch.int32)

    def commit(
        self,
        padded: PaddedBatch,
        input_batch: InputBatch,
        attn_groups: list[list[AttentionGroup]],
        for_cudagraph_capture: bool = False,
    ) -> dict[str, object]:
        """Pad the host buffers, copy them to the device and build the
        attention metadata over the padded batch (the real entries are filled)."""
        block_table = input_batch.block_table
        write_padding(
            padded,
            self.input_ids.np,
            self.positions.np,
            self.query_start_loc.np,
            self.seq_lens.np,
            [bt.slot_mapping.np for bt in block_table.block_tables],
        )
        num_reqs, num_tokens = padded.num_reqs_padded, padded.num_tokens_padded
        block_table.commit_block_table(padded.num_reqs)
        block_table.commit_slot_mapping(num_tokens)
        self.input_ids.copy_to_gpu(num_tokens)
        self.positions.copy_to_gpu(num_tokens)
        self.query_start_loc.copy_to_gpu(num_reqs + 1)
        self.seq_lens.copy_to_gpu(num_reqs)
        # Tokens already cached: the real requests', 0 for the dummy ones.
        num_computed = input_batch.num_computed_tokens_cpu_tensor[: padded.num_reqs]
        if num_reqs > padded.num_reqs:
            num_computed = torch.cat(
                [num_computed, num_computed.new_zeros(num_reqs - padded.num_reqs)]
            )
        return self._build_attention_metadata(
            attn_groups, input_batch, padded, num_computed, for_cudagraph_capture
        )

    def commit_tokens_only(self, padded: PaddedBatch) -> None:
        """A dummy batch without a KV cache (the profile run): token ids and
        positions only, no attention metadata."""
        write_padding(
            padded,
            self.input_ids.np,
            self.positions.np,
            self.query_start_loc.np,
            self.seq_lens.np,
            [],
        )
        self.input_ids.copy_to_gpu(padded.num_tokens_padded)
        self.positions.copy_to_gpu(padded.num_tokens_padded)

    def _build_attention_metadata(
        self,
        attn_groups: list[list[AttentionGroup]],
        input_batch: InputBatch,
        padded: PaddedBatch,
        num_computed_tokens_cpu: torch.Tensor,
        for_cudagraph_capture: bool,
    ) -> dict[str, object]:
        """One metadata object per attention group (per KV cache group, per
        backend), mapped to each of its layers, over the committed buffers."""
        num_reqs, num_tokens = padded.num_reqs_padded, padded.num_tokens_padded
        qsl = self.query_start_loc.np[: num_reqs + 1]
        max_query_len = int((qsl[1:] - qsl[:-1]).max())
        max_seq_len = int(self.seq_lens.np[:num_reqs].max())
        attn_metadata: dict[str, object] = {}
        for gid, groups in enumerate(attn_groups):
            if groups and is_cacheless_group(groups[0].kv_cache_spec):
                # Encoder-only layers: no blocks, so an all-zero table and no slots.
                block_table = torch.zeros((num_reqs, 1), dtype=torch.int32, device=self.device)
                slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64, device=self.device)
            else:
                group_table = input_batch.block_table[gid]
                block_table = group_table.get_device_tensor(num_reqs)
                slot_mapping = group_table.slot_mapping.gpu[:num_tokens]
            common = CommonAttentionMetadata(
                query_start_loc=self.query_start_loc.gpu[: num_reqs + 1],
                query_start_loc_cpu=self.query_start_loc.cpu[: num_reqs + 1],
                seq_lens=self.seq_lens.gpu[:num_reqs],
                seq_lens_cpu=self.seq_lens.cpu[:num_reqs],
                num_computed_tokens_cpu=num_computed_tokens_cpu,
                num_reqs=num_reqs,
                num_actual_tokens=num_tokens,
                max_query_len=max_query_len,
                max_seq_len=max_seq_len,
                block_table_tensor=block_table,
                slot_mapping=slot_mapping,
            )
            build_group_attn_metadata(groups, common, for_cudagraph_capture, attn_metadata)
        return attn_metadata
