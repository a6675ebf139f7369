"""What `LLM.generate` and `AsyncLLM.generate` return (upstream: vllm/outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

import torch

from vllm.logprobs import FlatLogprobs, PromptLogprobs, SampleLogprobs

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    finish_reason is None while unfinished, else "stop", "length", "abort",
    "error" or "repetition"; stop_reason is the stop string or stop token id
    that ended it (None for EOS or a length cap).
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: LoRARequest | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, text={self.text!r}, "
            f"token_ids={self.token_ids}, cumulative_logprob={self.cumulative_logprob}, "
            f"logprobs={self.logprobs}, finish_reason={self.finish_reason}, "
            f"stop_reason={self.stop_reason})"
        )


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """The output of one request: its prompt and its `n` completions."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    lora_request: LoRARequest | None = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    kv_transfer_params: dict[str, Any] | None = None
    multi_modal_placeholders: dict[str, Any] = field(default_factory=dict)

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request into this one (streaming)."""
        self.finished |= next_output.finished
        self.num_cached_tokens = next_output.num_cached_tokens
        for nxt in next_output.outputs:
            for i, cur in enumerate(self.outputs):
                if cur.index != nxt.index:
                    continue
                if aggregate:
                    cur.text += nxt.text
                    cur.token_ids.extend(nxt.token_ids)
                    if cur.logprobs is not None and nxt.logprobs is not None:
                        _extend_logprobs(cur.logprobs, nxt.logprobs)
                    cur.cumulative_logprob = nxt.cumulative_logprob
                    cur.finish_reason = nxt.finish_reason
                    cur.stop_reason = nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, "
            f"prompt_logprobs={self.prompt_logprobs}, outputs={self.outputs}, "
            f"finished={self.finished}, num_cached_tokens={self.num_cached_tokens})"
        )


def _extend_logprobs(cur: SampleLogprobs, nxt: SampleLogprobs) -> None:
    if isinstance(cur, FlatLogprobs):
        cur.extend(nxt)
        return
    # One request's outputs all use the same representation (flat_logprobs).
    assert not isinstance(nxt, FlatLogprobs)
    cur.extend(nxt)


@dataclass
class PoolingOutput:
    """The output of one pooling request: `data` is the pooler's tensor
    (an embedding [D], class scores [num_labels], or per-token rows [T, D])."""

    data: torch.Tensor

    def __repr__(self) -> str:
        return f"PoolingOutput(data={self.data})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.__class__) and bool(torch.equal(self.data, other.data))


_O = TypeVar("_O")


class PoolingRequestOutput(Generic[_O]):
    """A finished pooling request: its id, output and prompt token ids."""

    def __init__(
        self,
        request_id: str,
        outputs: _O,
        prompt_token_ids: list[int],
        num_cached_tokens: int = 0,
        finished: bool = True,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.finished = finished
        self.outputs = outputs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(request_id={self.request_id!r}, outputs={self.outputs!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, "
            f"num_cached_tokens={self.num_cached_tokens}, finished={self.finished})"
        )


def _vector(pooling_output: PoolingOutput, what: str) -> list[float]:
    """The pooler's tensor as a list, when it is the 1-D `what` expected."""
    if pooling_output.data.ndim != 1:
        raise ValueError(f"pooled_data should be a 1-D {what}")
    return pooling_output.data.tolist()


@dataclass
class EmbeddingOutput:
    """One embedding vector."""

    embedding: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> EmbeddingOutput:
        return EmbeddingOutput(_vector(pooling_output, "embedding vector"))

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    """The class probabilities (or logits, with use_activation=False) of one input."""

    probs: list[float]

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> ClassificationOutput:
        return ClassificationOutput(_vector(pooling_output, "probability vector"))

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    """The similarity score of one (query, document) pair."""

    score: float

    @staticmethod
    def from_base(pooling_output: PoolingOutput) -> ScoringOutput:
        pooled_data = pooling_output.data
        if pooled_data.numel() != 1:
            raise ValueError(
                "pooled_data should be a scalar score (a cross-encoder has num_labels == 1)"
            )
        return ScoringOutput(float(pooled_data.reshape(()).item()))


class _TypedPoolingRequestOutput(PoolingRequestOutput[_O]):
    """A finished pooling request whose output is read as `output_type`
    (`from_base` converts the raw PoolingOutput; the other fields are kept)."""

    output_type: ClassVar[Any]

    @classmethod
    def from_base(cls, request_output: PoolingRequestOutput[PoolingOutput]) -> Self:
        return cls(
            request_id=request_output.request_id,
            outputs=cls.output_type.from_base(request_output.outputs),
            prompt_token_ids=request_output.prompt_token_ids,
            num_cached_tokens=request_output.num_cached_tokens,
            finished=request_output.finished,
        )


class EmbeddingRequestOutput(_TypedPoolingRequestOutput[EmbeddingOutput]):
    output_type = EmbeddingOutput


class ClassificationRequestOutput(_TypedPoolingRequestOutput[ClassificationOutput]):
    output_type = ClassificationOutput


class ScoringRequestOutput(_TypedPoolingRequestOutput[ScoringOutput]):
    output_type = ScoringOutput
