"""Parallel sampling, `n > 1` (upstream: vllm/v1/engine/parallel_sampling.py).

The engine core only knows requests with one output. A request with `n`
outputs is fanned out by the front end into `n` child requests, ids
`f"{i}_{parent_id}"` with n=1 each; when the parent has a seed, child i gets
`seed + i` so the children differ from each other but a rerun reproduces
them. The children's outputs are gathered back here:

* FINAL_ONLY: nothing is emitted until every child has finished; then one
  `RequestOutput` carries the n completions in index order.
* CUMULATIVE / DELTA: each child's output goes out as it comes, in a
  `RequestOutput` holding that one completion (its `index` tells which);
  the output is marked finished when the last child finishes.
"""

from __future__ import annotations

from copy import copy

from vllm.outputs import CompletionOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import EngineCoreRequest


class ParentRequest:
    """Fan-out and gathering state of one `n > 1` request."""

    def __init__(self, request: EngineCoreRequest) -> None:
        params = request.sampling_params
        assert params is not None and request.external_req_id is not None
        self.request_id = request.request_id
        self.external_req_id = request.external_req_id
        self.sampling_params: SamplingParams = params
        # Ids of the children that have not finished yet.
        self.child_requests: set[str] = set()
        # FINAL_ONLY: slot i receives child i's final completion.
        self.output_aggregator: list[CompletionOutput | None] = (
            [None] * params.n if params.output_kind == RequestOutputKind.FINAL_ONLY else []
        )
        self.max_num_generation_tokens = 0
        self.cached_child_sampling_params: SamplingParams | None = None

    @property
    def n(self) -> int:
        return self.sampling_params.n

    def _get_child_sampling_params(self, index: int) -> SamplingParams:
        """Child i's params: the parent's with n=1 (and seed + i when seeded).
        Unseeded children can all share one copy."""
        if self.cached_child_sampling_params is not None:
            return self.cached_child_sampling_params
        child = copy(self.sampling_params)
        child.n = 1
        seed = self.sampling_params.seed
        if seed is None:
            self.cached_child_sampling_params = child
        else:
            child.seed = seed + index
        return child

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """(child request id, child sampling params) of child `index`."""
        child_req_id = f"{index}_{self.request_id}"
        self.child_requests.add(child_req_id)
        return child_req_id, self._get_child_sampling_params(index)

    def get_outputs(
        self, child_request_id: str, completion_output: CompletionOutput
    ) -> tuple[list[CompletionOutput], bool]:
        """What to emit for this child output: (completions, parent finished).
        An empty list means emit nothing now."""
        already_returned = False
        if completion_output.finished():
            if child_request_id in self.child_requests:
                self.child_requests.remove(child_request_id)
            else:
                # Its final output went out in an earlier step.
                already_returned = True
        if self.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:
            outputs = [] if already_returned else [completion_output]
        else:
            self.output_aggregator[completion_output.index] = completion_output
            done = not self.child_requests
            outputs = list(self.output_aggregator) if done else []  # type: ignore[arg-type]
        return outputs, not self.child_requests

    def observe_num_generation_tokens(self, num_generation_tokens: int) -> int:
        self.max_num_generation_tokens = max(num_generation_tokens, self.max_num_generation_tokens)
        return self.max_num_generation_tokens
