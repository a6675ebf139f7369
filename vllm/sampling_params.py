"""Sampling parameters for text generation (upstream: vllm/sampling_params.py)."""
from __future__ import annotations

import copy
from enum import Enum, IntEnum
from typing import Any

import msgspec

from vllm.exceptions import VLLMValidationError

_SAMPLING_EPS = 1e-5  # temperatures below this are greedy
_MAX_TEMP = 1e-2  # 0 < T < 0.01 is raised to 0.01 to avoid overflow in logits / T


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(Enum):
    CUMULATIVE = 0  # every output carries everything generated so far
    DELTA = 1  # every output carries only what is new since the last one
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    dict=True,  # type: ignore[call-arg]
):
    """Sampling parameters for text generation, with upstream's fields,
    defaults and validation (errors are `VLLMValidationError`, a ValueError)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    extra_args: dict[str, Any] | None = None
    # Filled in by the engine, not by users.
    output_text_buffer_length: int = 0
    _all_stop_token_ids: set[int] = msgspec.field(default_factory=set)
    _eos_token_id: int | None = None
    _bad_words_token_ids: list[list[int]] | None = None

    @staticmethod
    def from_optional(**kwargs: Any) -> "SamplingParams":
        """Build from keyword arguments, dropping those that are None."""
        return SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.bad_words is None:
            self.bad_words = []
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        # A stop string can only be recognised once all its characters are in;
        # hold back that many characters minus one from streamed text.
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            # Greedy: the other sampling knobs do nothing; reset them so the
            # sampler can take its fast path.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        # update, not assign: a decoded copy (msgspec runs __post_init__) keeps the
        # EOS ids the engine added.
        self._all_stop_token_ids.update(self.stop_token_ids)

    def _err(self, message: str, parameter: str) -> VLLMValidationError:
        return VLLMValidationError(message, parameter=parameter, value=getattr(self, parameter))

    def _verify_args(self) -> None:  # noqa: C901 - one check per field, flat
        if not isinstance(self.n, int) or self.n < 1:
            raise self._err(f"n must be at least 1, got {self.n}.", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise self._err(f"{name} must be in [-2, 2], got {getattr(self, name)}.", name)
        if self.repetition_penalty <= 0.0:
            raise self._err("repetition_penalty must be greater than zero, got "
                            f"{self.repetition_penalty}.", "repetition_penalty")
        if self.temperature < 0.0:
            raise self._err(f"temperature must be non-negative, got {self.temperature}.",
                            "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise self._err(f"top_p must be in (0, 1], got {self.top_p}.", "top_p")
        if self.top_k < -1:
            raise self._err("top_k must be 0 (disable), -1 (disable), or at least 1, "
                            f"got {self.top_k}.", "top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise self._err(f"min_p must be in [0, 1], got {self.min_p}.", "min_p")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise self._err(f"max_tokens must be at least 1, got {self.max_tokens}.",
                            "max_tokens")
        if self.min_tokens < 0:
            raise self._err("min_tokens must be greater than or equal to 0, got "
                            f"{self.min_tokens}.", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise self._err(f"min_tokens must be less than or equal to max_tokens="
                            f"{self.max_tokens}, got {self.min_tokens}.", "min_tokens")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and v < -1:
                raise self._err(f"{name} must be non-negative or -1, got {v}.", name)
        if any(s == "" for s in self.stop):  # type: ignore[union-attr]
            raise self._err("stop cannot contain an empty string.", "stop")
        if self.stop and not self.detokenize:
            raise self._err("stop strings are only supported when detokenize is True. "
                            "Set detokenize=True to use stop.", "stop")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        return self._bad_words_token_ids

    def update_from_generation_config(self, generation_config: dict[str, Any],
                                      model_eos_token_id: int | None = None) -> None:
        """Add the model's extra EOS ids (generation_config.json) to the stop ids."""
        if model_eos_token_id is not None:
            # Known to the stop checks (and min_tokens) even with ignore_eos.
            self._eos_token_id = model_eos_token_id
            self._all_stop_token_ids.add(model_eos_token_id)
        eos_ids = generation_config.get("eos_token_id")
        if eos_ids is None:
            return
        eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
        if model_eos_token_id is not None:
            eos_ids.discard(model_eos_token_id)
        if eos_ids:
            self._all_stop_token_ids.update(eos_ids)
            if not self.ignore_eos:
                self.stop_token_ids = sorted(set(self.stop_token_ids or []) | eos_ids)

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Turn `bad_words` into token-id sequences (with and without a leading space)."""
        if not self.bad_words:
            return
        ids: list[list[int]] = []
        for word in self.bad_words:
            for variant in (word, " " + word.lstrip()):
                toks = tokenizer.encode(variant, add_special_tokens=False)
                if toks and toks not in ids:
                    ids.append(toks)
        self._bad_words_token_ids = ids

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        fields = ("n", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                  "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
                  "skip_special_tokens")
        return "SamplingParams(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in fields) + ")"
