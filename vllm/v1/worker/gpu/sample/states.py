"""Per-request sampling parameters of Model Runner V2
(upstream: vllm/v1/worker/gpu/sample/states.py).

One row per request, the same row as in `RequestState`. The host arrays are
the source of truth; `apply_staged_writes()` publishes them to the device
once per step (a no-op on CPU, where both are the same memory). Questions
about a batch ("does any row use top-k?") are answered from the host arrays
through `idx_mapping_np`, so they never wait for the device.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.worker.utils import CpuGpuBuffer

NO_LOGPROBS = -1
_NP_INT64_MIN = np.iinfo(np.int64).min
_NP_INT64_MAX = np.iinfo(np.int64).max


class SamplingStates:
    """temperature, top_k, top_p, min_p, seed and logprob count per request row."""

    def __init__(
        self,
        max_num_reqs: int,
        vocab_size: int,
        device: torch.device,
        seed_rng: np.random.Generator | None = None,
        pin_memory: bool = False,
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        # Draws the seeds of requests that have none.
        self.seed_rng = seed_rng if seed_rng is not None else np.random.default_rng()

        def buf(dtype: torch.dtype) -> CpuGpuBuffer:
            return CpuGpuBuffer(max_num_reqs, dtype=dtype, device=device, pin_memory=pin_memory)

        # 0.0 = greedy.
        self.temperature = buf(torch.float32)
        # vocab_size = no top-k; 1.0 = no top-p; 0.0 = no min-p.
        self.top_k = buf(torch.int32)
        self.top_p = buf(torch.float32)
        self.min_p = buf(torch.float32)
        self.seeds = buf(torch.int64)
        self.top_k.np.fill(vocab_size)
        self.top_p.np.fill(1.0)
        # Top logprobs per row (NO_LOGPROBS = none asked for).
        self.num_logprobs = np.full(max_num_reqs, NO_LOGPROBS, dtype=np.int32)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> None:
        params = sampling_params
        greedy = params.temperature < 1e-5  # SamplingParams' greedy threshold
        self.temperature.np[req_idx] = 0.0 if greedy else params.temperature
        top_k = params.top_k
        self.top_k.np[req_idx] = top_k if 0 < top_k < self.vocab_size else self.vocab_size
        self.top_p.np[req_idx] = params.top_p
        self.min_p.np[req_idx] = params.min_p
        seed = params.seed
        if seed is None:
            seed = int(self.seed_rng.integers(_NP_INT64_MIN, _NP_INT64_MAX))
        self.seeds.np[req_idx] = seed
        num_logprobs = params.logprobs
        if num_logprobs is None:
            num_logprobs = NO_LOGPROBS
        elif num_logprobs == -1:
            num_logprobs = self.vocab_size
        self.num_logprobs[req_idx] = num_logprobs

    def apply_staged_writes(self) -> None:
        for param in (self.temperature, self.top_k, self.top_p, self.min_p, self.seeds):
            param.copy_to_gpu()

    def is_greedy(self, idx_mapping_np: np.ndarray) -> np.ndarray:
        return self.temperature.np[idx_mapping_np] == 0.0

    def needs_temperature(self, idx_mapping_np: np.ndarray) -> bool:
        temp = self.temperature.np[idx_mapping_np]
        return bool(np.any((temp != 0.0) & (temp != 1.0)))

    def do_min_p(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(np.any(self.min_p.np[idx_mapping_np] > 0.0))

    def do_top_k(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(np.any(self.top_k.np[idx_mapping_np] < self.vocab_size))

    def do_top_p(self, idx_mapping_np: np.ndarray) -> bool:
        return bool(np.any(self.top_p.np[idx_mapping_np] < 1.0))

    def max_num_logprobs(self, idx_mapping_np: np.ndarray) -> int:
        """Largest logprob count in the batch, NO_LOGPROBS when none asked."""
        return int(self.num_logprobs[idx_mapping_np].max(initial=NO_LOGPROBS))
