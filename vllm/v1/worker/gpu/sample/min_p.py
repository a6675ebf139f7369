"""Min-p filtering for Model Runner V2 (upstream: vllm/v1/worker/gpu/sample/min_p.py).

The filter itself is the V1 sampler's op; V2 only restricts it to the rows
whose request asked for min-p, which are known on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.v1.sample.sampler import Sampler as V1Sampler


def apply_min_p(
    logits: torch.Tensor, idx_mapping: torch.Tensor, min_p: torch.Tensor, rows_np: np.ndarray
) -> None:
    """Mask, in place, the tokens of row i whose probability is below
    min_p[idx_mapping[i]] times the row's top probability, for the batch rows
    `rows_np` (those with min_p > 0)."""
    if rows_np.size == logits.shape[0]:
        V1Sampler.apply_min_p(logits, min_p[idx_mapping.to(torch.int64)])
        return
    sel = torch.from_numpy(rows_np).to(logits.device)
    sub = logits[sel]
    V1Sampler.apply_min_p(sub, min_p[idx_mapping.to(torch.int64)[sel]])
    logits[sel] = sub
