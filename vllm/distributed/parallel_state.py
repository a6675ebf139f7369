"""Process groups for tensor, pipeline, data and expert parallelism
(upstream: vllm/distributed/parallel_state.py).

Ranks are laid out as upstream (DP x PP x TP, TP fastest): global rank =
dp_rank * pp_size * tp_size + pp_rank * tp_size + tp_rank, so a
tensor-parallel group is `tp_size` consecutive ranks, a pipeline group takes
every `tp_size`-th rank of one DP replica, a data-parallel group takes the
same (pp, tp) position in every replica, and an expert-parallel group is all
the DP x TP ranks of one pipeline stage. The DP and EP groups only exist in
the one world that the workers of all DP engines of a mixture-of-experts
model join (see `vllm/v1/worker/gpu_worker.py:init_worker_distributed_environment`);
otherwise DP is one rank and EP equals TP.

Each `GroupCoordinator` holds two torch.distributed groups over the same
ranks: `device_group` for tensors on the model's device (NCCL on CUDA, gloo on
CPU) and `cpu_group` (always gloo) for small host-side metadata. Before (or
without) `initialize_model_parallel` every getter returns a one-rank group
whose collectives are the identity, so single-process code and models built
outside a worker need no set-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from vllm.logger import init_logger

logger = init_logger(__name__)

# Metadata of a tensor dict: key -> (dtype name, shape); plain msgpack, never pickle.
_DTYPES = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.int8,
        torch.bool,
    )
}


@dataclass
class _TensorMeta:
    dtype: str
    shape: tuple[int, ...]


class GroupCoordinator:
    """One process group seen from one of its ranks.

    `ranks` are global ranks; `rank_in_group` is this process's index in them.
    Collectives act on `device_group`; `send_tensor_dict`/`recv_tensor_dict`
    (pipeline stages) send their metadata over `cpu_group`.
    """

    def __init__(
        self,
        group_ranks: list[list[int]],
        local_rank: int,
        torch_distributed_backend: str,
        group_name: str,
    ) -> None:
        self.unique_name = group_name
        self.local_rank = local_rank
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.ranks: list[int] = [self.rank]
        self.device_group: Any = None
        self.cpu_group: Any = None
        for ranks in group_ranks:
            # Every rank must create every group, in the same order.
            device_group = dist.new_group(ranks, backend=torch_distributed_backend)
            cpu_group = (
                device_group
                if torch_distributed_backend == "gloo"
                else dist.new_group(ranks, backend="gloo")
            )
            if self.rank in ranks:
                self.ranks = list(ranks)
                self.device_group = device_group
                self.cpu_group = cpu_group
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(self.rank)

    @classmethod
    def single(cls, group_name: str) -> GroupCoordinator:
        """A group of just this process: every collective is the identity."""
        return cls([], local_rank=0, torch_distributed_backend="gloo", group_name=group_name)

    # ---- position in the group ----------------------------------------------------
    @property
    def first_rank(self) -> int:
        return self.ranks[0]

    @property
    def last_rank(self) -> int:
        return self.ranks[-1]

    @property
    def is_first_rank(self) -> bool:
        return self.rank == self.first_rank

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.last_rank

    @property
    def next_rank(self) -> int:
        """Global rank of the next process in the group (wrapping around)."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        """Global rank of the previous process in the group (wrapping around)."""
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    # ---- collectives ----------------------------------------------------------------
    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """Sum over the group (in place; returns the tensor)."""
        if self.world_size == 1:
            return input_
        dist.all_reduce(input_, group=self.device_group)
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's tensor along `dim`, in rank order."""
        if self.world_size == 1:
            return input_
        input_ = input_.contiguous()
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_, group=self.device_group)
        return torch.cat(parts, dim=dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Concatenation along `dim` on rank_in_group `dst`; None elsewhere."""
        if self.world_size == 1:
            return input_
        input_ = input_.contiguous()
        parts = (
            [torch.empty_like(input_) for _ in range(self.world_size)]
            if self.rank_in_group == dst
            else None
        )
        dist.gather(input_, parts, dst=self.ranks[dst], group=self.device_group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank_in_group `src`'s tensor on every rank (in place)."""
        if self.world_size == 1:
            return input_
        dist.broadcast(input_, src=self.ranks[src], group=self.device_group)
        return input_

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)

    # ---- point to point (pipeline stages) --------------------------------------------
    def send_tensor_dict(
        self, tensor_dict: dict[str, torch.Tensor], dst: int | None = None
    ) -> None:
        """Send name -> tensor to rank_in_group `dst` (default: the next rank).
        The metadata (names, dtypes, shapes) goes first as msgpack bytes."""
        if self.world_size == 1:
            return
        dst_rank = self.next_rank if dst is None else self.ranks[dst]
        meta = {
            k: _TensorMeta(str(t.dtype).removeprefix("torch."), tuple(t.shape))
            for k, t in tensor_dict.items()
        }
        payload = torch.frombuffer(bytearray(msgspec.msgpack.encode(meta)), dtype=torch.uint8)
        dist.send(
            torch.tensor([payload.numel()], dtype=torch.int64), dst_rank, group=self.cpu_group
        )
        dist.send(payload, dst_rank, group=self.cpu_group)
        for tensor in tensor_dict.values():
            dist.send(tensor.contiguous(), dst_rank, group=self.device_group)

    def recv_tensor_dict(
        self, src: int | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """Receive what `send_tensor_dict` on rank_in_group `src` (default:
        the previous rank) sent."""
        assert self.world_size > 1, "nothing to receive in a one-rank group"
        src_rank = self.prev_rank if src is None else self.ranks[src]
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, src_rank, group=self.cpu_group)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(payload, src_rank, group=self.cpu_group)
        meta = msgspec.msgpack.decode(payload.numpy().tobytes(), type=dict[str, _TensorMeta])
        out: dict[str, torch.Tensor] = {}
        for key, m in meta.items():
            if m.dtype not in _DTYPES:
                raise ValueError(f"Unexpected tensor dtype {m.dtype!r} from rank {src_rank}.")
            out[key] = torch.empty(m.shape, dtype=_DTYPES[m.dtype], device=device)
            dist.recv(out[key], src_rank, group=self.device_group)
        return out

    def destroy(self) -> None:
        for group in {
            id(g): g for g in (self.device_group, self.cpu_group) if g is not None
        }.values():
            dist.destroy_process_group(group)
        self.device_group = self.cpu_group = None


_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None
_PP: GroupCoordinator | None = None
_DP: GroupCoordinator | None = None
_EP: GroupCoordinator | None = None
_SINGLE = {name: GroupCoordinator.single(name) for name in ("world", "tp", "pp", "dp", "ep")}


def get_world_group() -> GroupCoordinator:
    return _WORLD or _SINGLE["world"]


def get_tp_group() -> GroupCoordinator:
    """This process's tensor-parallel group (a one-rank group when none is set up)."""
    return _TP or _SINGLE["tp"]


def get_pp_group() -> GroupCoordinator:
    """This process's pipeline-parallel group (a one-rank group when none is set up)."""
    return _PP or _SINGLE["pp"]


def get_dp_group() -> GroupCoordinator:
    """This process's data-parallel group: the same (pp, tp) rank of every DP
    engine in one world (a one-rank group when DP is not part of the world)."""
    return _DP or _SINGLE["dp"]


def get_ep_group() -> GroupCoordinator:
    """This process's expert-parallel group: the DP x TP ranks of its pipeline
    stage (a one-rank group when none is set up)."""
    return _EP or _SINGLE["ep"]


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return get_pp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


def init_distributed_environment(
    world_size: int = -1,
    rank: int = -1,
    distributed_init_method: str = "env://",
    local_rank: int = -1,
    backend: str = "gloo",
) -> None:
    """Join the torch.distributed world (idempotent) and build the world group."""
    global _WORLD
    if not dist.is_initialized():
        logger.debug(
            "init_process_group(%s, rank %d/%d, %s)",
            backend,
            rank,
            world_size,
            distributed_init_method,
        )
        dist.init_process_group(
            backend=backend, init_method=distributed_init_method, world_size=world_size, rank=rank
        )
    if _WORLD is None:
        _WORLD = GroupCoordinator(
            [list(range(dist.get_world_size()))],
            local_rank=max(local_rank, 0),
            torch_distributed_backend=backend,
            group_name="world",
        )


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    backend: str | None = None,
) -> None:
    """Split the world into tensor-parallel groups (consecutive ranks),
    pipeline groups (stride `tensor_model_parallel_size` within one DP
    replica), data-parallel groups (stride pp x tp) and expert-parallel groups
    (all DP x TP ranks of a stage). The DP size is the world size over tp x pp."""
    global _TP, _PP, _DP, _EP
    assert dist.is_initialized(), "init_distributed_environment() first"
    world_size = dist.get_world_size()
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if world_size % (tp * pp):
        raise ValueError(
            f"world_size ({world_size}) is not data_parallel_size x tensor_parallel_size ({tp}) "
            f"x pipeline_parallel_size ({pp})."
        )
    dp = world_size // (tp * pp)
    backend = backend or dist.get_backend()
    local_rank = get_world_group().local_rank
    # ranks[d][p][t] = global rank of DP replica d, stage p, TP rank t.
    ranks = [[[(d * pp + p) * tp + t for t in range(tp)] for p in range(pp)] for d in range(dp)]
    _TP = GroupCoordinator(
        [ranks[d][p] for d in range(dp) for p in range(pp)], local_rank, backend, "tp"
    )
    _PP = GroupCoordinator(
        [[ranks[d][p][t] for p in range(pp)] for d in range(dp) for t in range(tp)],
        local_rank,
        backend,
        "pp",
    )
    _DP = GroupCoordinator(
        [[ranks[d][p][t] for d in range(dp)] for p in range(pp) for t in range(tp)],
        local_rank,
        backend,
        "dp",
    )
    _EP = GroupCoordinator(
        [[r for d in range(dp) for r in ranks[d][p]] for p in range(pp)], local_rank, backend, "ep"
    )


def ensure_model_parallel_initialized(
    tensor_model_parallel_size: int, pipeline_model_parallel_size: int, backend: str | None = None
) -> None:
    """Initialise the model-parallel groups, or check the existing ones match."""
    if not model_parallel_is_initialized():
        initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size, backend)
        return
    if (get_tp_group().world_size, get_pp_group().world_size) != (
        tensor_model_parallel_size,
        pipeline_model_parallel_size,
    ):
        raise ValueError(
            "Model parallel groups already exist with different sizes: "
            f"tp={get_tp_group().world_size}, pp={get_pp_group().world_size}."
        )


def model_parallel_is_initialized() -> bool:
    return _TP is not None and _PP is not None


def destroy_model_parallel() -> None:
    global _TP, _PP, _DP, _EP
    for group in (_TP, _PP, _DP, _EP):
        if group is not None:
            group.destroy()
    _TP = _PP = _DP = _EP = None


def destroy_distributed_environment() -> None:
    global _WORLD
    destroy_model_parallel()
    _WORLD = None
    if dist.is_initialized():
        dist.destroy_process_group()
