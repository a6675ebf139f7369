"""Host-to-device state updates for Model Runner V2
(upstream: vllm/v1/worker/gpu/buffer_utils.py).

V2 keeps per-request state in device tensors, one row per request. The host
learns of changes (a new request's tokens, new KV blocks) one at a time;
`StagedWriteTensor` records them as diffs and applies them all in one pass
just before the step's inputs are prepared, so a step costs one launch (CUDA:
one Triton kernel; CPU: one vectorised scatter), not one copy per change.

Small per-row parameters that live on the host and are only read by the
device (prompt lengths, sampling parameters) use `CpuGpuBuffer`
(vllm/v1/worker/utils.py): numpy is the source of truth and `copy_to_gpu()`
publishes it (free on CPU, where the two are the same memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from vllm.triton_utils import HAS_TRITON, tl, triton

_SUPPORTED_DTYPES = (torch.int32, torch.int64, torch.float32)


def async_copy_to_gpu(
    x: np.ndarray, out: torch.Tensor | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """Copy a host array to the device (into `out` when given).

    On a CPU device without `out` the result *aliases* `x` (no copy), so `x`
    must not be reused while the result is alive.
    """
    src = torch.from_numpy(x)
    if out is not None:
        return out.copy_(src, non_blocking=True)
    assert device is not None
    return src if device.type == "cpu" else src.to(device, non_blocking=True)


class StagedWriteTensor:
    """A device tensor updated by batches of host-side row writes.

    `stage_write(index, start, values)` records "row `index`, from column
    `start`, becomes `values`"; `apply_write()` applies every staged write at
    once and clears the stage. 1-D tensors use `stage_write_elem(index, x)`.
    Writes are applied in staging order, so a later write to the same place wins.
    """

    def __init__(self, size: int | Sequence[int], dtype: torch.dtype, device: torch.device) -> None:
        if dtype not in _SUPPORTED_DTYPES:
            raise ValueError(f"Unsupported dtype {dtype}; expected one of {_SUPPORTED_DTYPES}.")
        self.dtype = dtype
        self.device = device
        self.gpu = torch.zeros(size, dtype=dtype, device=device)
        self.num_rows = self.gpu.shape[0]
        self._staged_write_indices: list[int] = []
        self._staged_write_starts: list[int] = []
        self._staged_write_contents: list[int | float] = []
        # Running total of staged values after each write.
        self._staged_write_cu_lens: list[int] = []

    def stage_write(self, index: int, start: int, x: Iterable[int] | Iterable[float]) -> None:
        assert 0 <= index < self.num_rows and start >= 0
        n = len(self._staged_write_contents)
        self._staged_write_contents.extend(x)
        if len(self._staged_write_contents) == n:
            return  # nothing to write
        self._staged_write_indices.append(index)
        self._staged_write_starts.append(start)
        self._staged_write_cu_lens.append(len(self._staged_write_contents))

    def stage_write_elem(self, index: int, x: int | float) -> None:
        assert 0 <= index < self.num_rows
        self._staged_write_indices.append(index)
        self._staged_write_starts.append(0)
        self._staged_write_contents.append(x)
        self._staged_write_cu_lens.append(len(self._staged_write_contents))

    @property
    def has_staged_writes(self) -> bool:
        return bool(self._staged_write_indices)

    def apply_write(self) -> None:
        if not self._staged_write_indices:
            return
        apply_staged_writes(
            self.gpu,
            np.asarray(self._staged_write_indices, dtype=np.int64),
            np.asarray(self._staged_write_starts, dtype=np.int64),
            torch.tensor(self._staged_write_contents, dtype=self.dtype),
            np.asarray(self._staged_write_cu_lens, dtype=np.int64),
        )
        self.clear_staged_writes()

    def clear_staged_writes(self) -> None:
        self._staged_write_indices.clear()
        self._staged_write_starts.clear()
        self._staged_write_contents.clear()
        self._staged_write_cu_lens.clear()


def apply_staged_writes(
    output: torch.Tensor,
    indices: np.ndarray,
    starts: np.ndarray,
    contents: torch.Tensor,
    cu_lens: np.ndarray,
) -> None:
    """Write `contents[cu_lens[i-1]:cu_lens[i]]` to `output[indices[i], starts[i]:]`
    for every i (a 1-D `output` is treated as one column per row)."""
    if output.is_cuda and HAS_TRITON:
        _apply_write_triton(output, indices, starts, contents, cu_lens)
    else:
        _apply_write_torch(output, indices, starts, contents, cu_lens)


def _apply_write_torch(
    output: torch.Tensor,
    indices: np.ndarray,
    starts: np.ndarray,
    contents: torch.Tensor,
    cu_lens: np.ndarray,
) -> None:
    assert output.is_contiguous()
    stride = output.stride(0)
    lens = np.diff(cu_lens, prepend=0)
    # Flat destination of value j of write i: row base + start + (j - first value of i).
    first = cu_lens - lens
    offsets = np.repeat(indices * stride + starts - first, lens) + np.arange(cu_lens[-1])
    dst = torch.from_numpy(offsets).to(output.device, non_blocking=True)
    output.view(-1).index_copy_(0, dst, contents.to(output.device, non_blocking=True))


def _apply_write_triton(
    output: torch.Tensor,
    indices: np.ndarray,
    starts: np.ndarray,
    contents: torch.Tensor,
    cu_lens: np.ndarray,
) -> None:
    device = output.device
    as_dev = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    n = indices.shape[0]
    _apply_write_kernel[(n,)](
        output,
        output.stride(0) if output.dim() > 1 else 1,
        as_dev(indices),
        as_dev(starts),
        contents.to(device, non_blocking=True),
        as_dev(cu_lens),
        BLOCK_SIZE=1024,
    )


@triton.jit
def _apply_write_kernel(
    output_ptr,
    output_stride,
    indices_ptr,
    starts_ptr,
    contents_ptr,
    cu_lens_ptr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per staged write: copy its values into its row.
    pid = tl.program_id(0)
    row = tl.load(indices_ptr + pid)
    start = tl.load(starts_ptr + pid)
    cu_end = tl.load(cu_lens_ptr + pid)
    cu_start = tl.load(cu_lens_ptr + pid - 1, mask=pid > 0, other=0)
    n = cu_end - cu_start
    for i in range(0, n, BLOCK_SIZE):
        block = i + tl.arange(0, BLOCK_SIZE)
        mask = block < n
        values = tl.load(contents_ptr + cu_start + block, mask=mask)
        tl.store(output_ptr + row * output_stride + start + block, values, mask=mask)
