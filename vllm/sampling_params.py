"""Sampling parameters for text generation (upstream: vllm/sampling_params.py)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

import msgspec

from vllm.exceptions import VLLMValidationError

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

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


# The constraint kinds of StructuredOutputsParams; exactly one must be set.
_STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """One output constraint (upstream: vllm/sampling_params.py).

    Exactly one of `json` (a JSON schema, as a dict or its JSON text), `regex`,
    `choice`, `grammar` (EBNF), `json_object` (any JSON object) or
    `structural_tag` (its JSON text) is set. `_backend` and
    `_backend_was_auto` are filled in by the input processor.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    # Set by the input processor. Upstream makes them init=False; pydantic
    # refuses init=False fields in a dataclass nested in the server's
    # extra="allow" request models, so here a client may send them, and the
    # input processor refuses a `_backend` other than the server's.
    _backend: str | None = None
    _backend_was_auto: bool = False

    def __post_init__(self) -> None:
        kinds = [k for k in _STRUCTURED_OUTPUT_KINDS if _is_set(getattr(self, k))]
        if len(kinds) != 1:
            raise VLLMValidationError(
                "You must use one kind of structured outputs constraint but "
                f"{'none' if not kinds else ', '.join(kinds)} "
                f"{'was' if len(kinds) < 2 else 'were'} specified; set exactly one of "
                f"{', '.join(_STRUCTURED_OUTPUT_KINDS)}.",
                parameter="structured_outputs",
                value=kinds,
            )
        self._verify_types()

    def _verify_types(self) -> None:
        def bad(name: str, expected: str) -> VLLMValidationError:
            value = getattr(self, name)
            return VLLMValidationError(
                f"structured_outputs.{name} must be {expected}, got "
                f"{type(value).__name__}: {value!r:.200}",
                parameter=name,
                value=value,
            )

        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise bad("json", "a JSON schema (an object or its JSON text)")
        if isinstance(self.json, dict):
            # Before anything copies it (SamplingParams.clone): a schema
            # thousands of levels deep would exhaust the recursion limit.
            # Imported here: vllm.utils imports torch, which this module does not.
            from vllm.utils.json_schema import check_json_schema_depth

            try:
                check_json_schema_depth(self.json)
            except ValueError as e:
                raise VLLMValidationError(str(e), parameter="structured_outputs") from e
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise bad(name, "a string")
        if self.choice is not None and not (
            isinstance(self.choice, list)
            and self.choice
            and all(isinstance(c, str) for c in self.choice)
        ):
            raise bad("choice", "a non-empty list of strings")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise bad("json_object", "a boolean")

    @property
    def json_str(self) -> str | None:
        """The JSON schema as text (a dict schema is serialised)."""
        if isinstance(self.json, dict):
            return json.dumps(self.json)
        return self.json


def _is_set(value: Any) -> bool:
    """Whether a constraint field counts as given (False/""/[] do not)."""
    return value is not None and value is not False and value != "" and value != []


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
    # Return logprobs as FlatLogprobs (flat lists) instead of one dict per position.
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    extra_args: dict[str, Any] | None = None
    # Constrain the output to a JSON schema, regex, choice, grammar, ...
    structured_outputs: StructuredOutputsParams | None = None
    # Filled in by the engine, not by users.
    output_text_buffer_length: int = 0
    _all_stop_token_ids: set[int] = msgspec.field(default_factory=set)
    _eos_token_id: int | None = None
    _bad_words_token_ids: list[list[int]] | None = None

    @staticmethod
    def from_optional(**kwargs: Any) -> SamplingParams:
        """Build from keyword arguments, dropping those that are None; logit
        biases are clamped to [-100, 100] as upstream's API layer does."""
        params = {k: v for k, v in kwargs.items() if v is not None}
        if params.get("logit_bias"):
            params["logit_bias"] = {
                token: min(100.0, max(-100.0, bias))
                for token, bias in _convert_logit_bias(params["logit_bias"]).items()
            }
        return SamplingParams(**params)

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        # Duplicates change nothing but the work done per token: drop them,
        # keeping the first occurrence's order.
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        else:
            self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids))
        if self.bad_words is None:
            self.bad_words = []
        else:
            self.bad_words = list(dict.fromkeys(self.bad_words))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.logit_bias is not None:
            self.logit_bias = _convert_logit_bias(self.logit_bias)
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

    def _verify_args(self) -> None:
        """Upstream's checks and messages; every error names its parameter."""
        self._verify_n()
        self._verify_penalties()
        self._verify_sampling_knobs()
        self._verify_lengths()
        self._verify_logprobs()
        self._verify_stops()

    def _verify_n(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            raise self._err(f"n must be an int, but is of type {type(self.n)}", "n")
        if self.n < 1:
            raise self._err(f"n must be at least 1, got {self.n}.", "n")

    def _verify_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            # NaN fails the range test too.
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise self._err(f"{name} must be in [-2, 2], got {getattr(self, name)}.", name)
        if not math.isfinite(self.repetition_penalty):
            raise self._err(
                f"repetition_penalty must be a finite number, got {self.repetition_penalty}.",
                "repetition_penalty",
            )
        if self.repetition_penalty <= 0.0:
            raise self._err(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
                "repetition_penalty",
            )

    def _verify_sampling_knobs(self) -> None:
        if not math.isfinite(self.temperature):
            raise self._err(
                f"temperature must be a finite number, got {self.temperature}.", "temperature"
            )
        if self.temperature < 0.0:
            raise self._err(
                f"temperature must be non-negative, got {self.temperature}.", "temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise self._err(f"top_p must be in (0, 1], got {self.top_p}.", "top_p")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise self._err(f"top_k must be an integer, got {type(self.top_k).__name__}", "top_k")
        # -1 is quietly accepted as "disabled", like 0.
        if self.top_k < -1:
            raise self._err(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.", "top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise self._err(f"min_p must be in [0, 1], got {self.min_p}.", "min_p")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise self._err(f"seed must fit in 64 bits, got {self.seed}.", "seed")

    def _verify_lengths(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise self._err(f"max_tokens must be at least 1, got {self.max_tokens}.", "max_tokens")
        if self.min_tokens < 0:
            raise self._err(
                f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.",
                "min_tokens",
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise self._err(
                f"min_tokens must be less than or equal to max_tokens="
                f"{self.max_tokens}, got {self.min_tokens}.",
                "min_tokens",
            )

    def _verify_logprobs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and v != -1 and v < 0:
                raise self._err(f"{name} must be non-negative or -1, got {v}.", name)

    def _verify_stops(self) -> None:
        assert isinstance(self.stop_token_ids, list) and isinstance(self.stop, list)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise self._err(
                f"stop_token_ids must contain only integers, got {self.stop_token_ids}.",
                "stop_token_ids",
            )
        if any(not s for s in self.stop):
            raise self._err("stop cannot contain an empty string.", "stop")
        if self.stop and not self.detokenize:
            raise self._err(
                "stop strings are only supported when detokenize is True. "
                "Set detokenize=True to use stop.",
                "stop",
            )
        assert isinstance(self.bad_words, list)
        if any(not w for w in self.bad_words):
            raise self._err(
                f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}",
                "bad_words",
            )

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

    def update_from_generation_config(
        self, generation_config: dict[str, Any], eos_token_id: int | None = None
    ) -> None:
        """Add the model's extra EOS ids (generation_config.json) to the stop ids."""
        if eos_token_id is not None:
            # Known to the stop checks (and min_tokens) even with ignore_eos.
            self._eos_token_id = eos_token_id
            self._all_stop_token_ids.add(eos_token_id)
        eos_ids = generation_config.get("eos_token_id")
        if eos_ids is None:
            return
        eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
        if eos_token_id is not None:
            eos_ids.discard(eos_token_id)
        if eos_ids:
            self._all_stop_token_ids.update(eos_ids)
            if not self.ignore_eos:
                self.stop_token_ids = sorted(set(self.stop_token_ids or []) | eos_ids)

    def update_from_tokenizer(self, tokenizer: TokenizerLike) -> None:
        """Turn `bad_words` into token-id sequences, as upstream: each word as
        written (left-stripped) and, when it tokenizes to a different first
        token of the same length, with a leading space (a word at the start
        of the text vs. in the middle)."""
        if not self.bad_words:
            return
        ids: list[list[int]] = []
        for word in self.bad_words:
            for prefix in ("", " "):
                toks = list(tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
                if not toks:
                    if not prefix:
                        raise self._err(
                            "bad_words entries must tokenize to at least one token.", "bad_words"
                        )
                    continue
                if not prefix or (toks[0] != ids[-1][0] and len(toks) == len(ids[-1])):
                    ids.append(toks)
        max_token_id = _max_token_id(tokenizer)
        invalid = [t for seq in ids for t in seq if not 0 <= t <= max_token_id]
        if invalid:
            raise self._err(
                f"The model vocabulary size is {max_token_id + 1}, but the following "
                f"tokens were specified as bad: {invalid}. All token id values should be "
                f"integers satisfying: 0 <= token_id <= {max_token_id}.",
                "bad_words",
            )
        self._bad_words_token_ids = ids

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        fields = (
            "n",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "max_tokens",
            "min_tokens",
            "logprobs",
            "prompt_logprobs",
            "skip_special_tokens",
        )
        return "SamplingParams(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in fields) + ")"


def _convert_logit_bias(logit_bias: dict[Any, Any]) -> dict[int, float]:
    """Keys to int token ids (JSON sends them as strings), values to finite floats."""
    converted: dict[int, float] = {}
    bad_keys = []
    for token, bias in logit_bias.items():
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            bad_keys.append(token)
            continue
        try:
            value = float(bias)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise VLLMValidationError(
                f"logit_bias values must be finite numbers, got {bias!r} for token {token!r}.",
                parameter="logit_bias",
                value=bias,
            )
        converted[token_id] = value
    if bad_keys:
        raise VLLMValidationError(
            "logit_bias contains key(s) that cannot be converted to "
            f"integer token IDs: {bad_keys!r}",
            parameter="logit_bias",
            value=bad_keys,
        )
    return converted


def _max_token_id(tokenizer: TokenizerLike) -> int:
    """The largest token id the tokenizer knows (added tokens included)."""
    max_id = getattr(tokenizer, "max_token_id", None)
    if max_id is not None:
        return int(max_id)
    return max(tokenizer.get_vocab().values())


class BeamSearchParams(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    dict=True,  # type: ignore[call-arg]
):
    """Parameters of `LLM.beam_search` (upstream: vllm/sampling_params.py).

    Each step keeps the `beam_width` best continuations of every prompt among
    the top 2 * beam_width tokens of each beam; `length_penalty` divides a
    finished sequence's cumulative logprob by its length ** length_penalty.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise VLLMValidationError(
                    f"{name} must be an int of at least 1, got {value!r}.",
                    parameter=name,
                    value=value,
                )
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise VLLMValidationError(
                f"temperature must be a finite non-negative number, got {self.temperature}.",
                parameter="temperature",
                value=self.temperature,
            )
        if not math.isfinite(self.length_penalty):
            raise VLLMValidationError(
                f"length_penalty must be a finite number, got {self.length_penalty}.",
                parameter="length_penalty",
                value=self.length_penalty,
            )
