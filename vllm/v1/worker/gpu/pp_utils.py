"""Pipeline-parallel helpers of Model Runner V2 (upstream: vllm/v1/worker/gpu/pp_utils.py).

Only the last stage has logits and samples. Every stage keeps its own copy of
the request rows, though, and the next step's decode inputs come from each
stage's `last_sampled_tokens`; so the last stage broadcasts the tokens it
sampled and the earlier stages record them as if they had sampled them.

The broadcast goes through host memory (`[num_logits, 1]` int64 on the CPU),
which every backend of the PP group can carry. A dummy batch's intermediate
tensors (`pp_dummy_intermediate_tensors`) are shared with the V1 runner, in
vllm/v1/worker/utils.py.
"""

from __future__ import annotations

import torch

from vllm.distributed import get_pp_group


def pp_broadcast(sampled_token_ids: torch.Tensor) -> None:
    """Last stage: send this step's sampled tokens [num_logits, 1] to the
    earlier stages. A no-op without pipeline parallelism."""
    pp_group = get_pp_group()
    if pp_group.world_size > 1:
        pp_group.broadcast(sampled_token_ids.cpu(), src=pp_group.world_size - 1)


def pp_receive(num_logits: int, device: torch.device) -> torch.Tensor:
    """A stage before the last: the tokens the last stage sampled this step,
    [num_logits, 1] int64 on `device`."""
    pp_group = get_pp_group()
    sampled = torch.empty((num_logits, 1), dtype=torch.int64)
    pp_group.broadcast(sampled, src=pp_group.world_size - 1)
    return sampled.to(device)
