"""The step output of Model Runner V2 (upstream: vllm/v1/worker/gpu/async_utils.py).

`sample_tokens` leaves the sampled tokens on the device (the next step reads
them there) and starts their copy to the host on a side stream; `AsyncOutput`
holds that copy, and `get_output()` waits for it and builds the
`ModelRunnerOutput` the scheduler reads. With async scheduling the engine core
calls `get_output()` only after it has scheduled the next step; without it the
runner calls it right away. On CPU the "copy" is a view and nothing waits.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.v1.outputs import (
    AsyncModelRunnerOutput,
    LogprobsLists,
    LogprobsTensors,
    ModelRunnerOutput,
    SamplerOutput,
)


class AsyncOutput(AsyncModelRunnerOutput):
    """A step's `ModelRunnerOutput`, completed once its host copies land."""

    def __init__(
        self,
        model_runner_output: ModelRunnerOutput,
        sampler_output: SamplerOutput,
        num_sampled_tokens: torch.Tensor,
        copy_stream: torch.cuda.Stream | None = None,
        cu_num_logits_np: np.ndarray | None = None,
    ) -> None:
        self.model_runner_output = model_runner_output
        # With drafts: request i's logits (and logprobs) rows start at
        # cu_num_logits_np[i]; only its emitted tokens' rows are kept.
        self.cu_num_logits_np = cu_num_logits_np
        # Keep the device tensors alive until the side-stream copies are done.
        self.sampler_output = sampler_output
        self.num_sampled_tokens = num_sampled_tokens
        self.copy_event: torch.cuda.Event | None = None
        logprobs = sampler_output.logprobs_tensors
        if copy_stream is None:
            self.sampled_token_ids = sampler_output.sampled_token_ids.numpy()
            self.num_sampled_tokens_np = num_sampled_tokens.numpy()
            self.logprobs_tensors = logprobs
            return
        main_stream = torch.cuda.current_stream()
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(main_stream)
            self.sampled_token_ids = _to_host(sampler_output.sampled_token_ids)
            self.num_sampled_tokens_np = _to_host(num_sampled_tokens)
            self.logprobs_tensors = (
                None
                if logprobs is None
                else LogprobsTensors(*(t.to("cpu", non_blocking=True) for t in logprobs))
            )
            self.copy_event = torch.cuda.Event()
            self.copy_event.record(copy_stream)

    def get_output(self) -> ModelRunnerOutput:
        if self.copy_event is not None:
            self.copy_event.synchronize()
        out = self.model_runner_output
        sampled: list[list[int]] = self.sampled_token_ids.tolist()
        for tokens, n in zip(sampled, self.num_sampled_tokens_np.tolist()):
            del tokens[n:]  # mid-prefill rows sampled nothing: []
        out.sampled_token_ids = sampled
        if self.logprobs_tensors is not None:
            out.logprobs = self._logprobs_lists(self.logprobs_tensors)
        return out

    def _logprobs_lists(self, tensors: LogprobsTensors) -> LogprobsLists:
        """One row per emitted token; with drafts, `cu_num_generated_tokens`
        marks where each request's rows start."""
        if self.cu_num_logits_np is None:
            return tensors.tolists()
        num_emitted = self.num_sampled_tokens_np.astype(np.int64)
        starts = self.cu_num_logits_np[:-1].astype(np.int64)
        rows = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(starts.tolist(), num_emitted.tolist())]
            + [np.empty(0, dtype=np.int64)]
        )
        cu = np.zeros(len(num_emitted) + 1, dtype=np.int64)
        np.cumsum(num_emitted, out=cu[1:])
        index = torch.from_numpy(rows)
        kept = LogprobsTensors(*(t[index] for t in tensors))
        return kept.tolists(cu.tolist())


def _to_host(x: torch.Tensor) -> np.ndarray:
    """Start a device-to-host copy; valid once the stream's event is reached."""
    return x.to("cpu", non_blocking=True).numpy()
