"""Shared harness for the tool-parser tests: small real tokenizers, requests,
and a driver that streams an output through a parser as the server does.

- `make_tokenizer(special_tokens, corpus)`: a byte-level BPE tokenizer trained
  here on `corpus` (the family's fixture outputs), with the family's markers
  added as special tokens (so each is one token id, as in the real model's
  tokenizer). No download. `embedded_tokenizer()`: the SmolLM2 tokenizer of
  the embedded default model (no tool-call special tokens).
- `run_streaming(parser, tokenizer, text, chunks)`: encode `text`, feed the
  ids in steps of `chunks` tokens with upstream's argument convention
  (previous/current/delta text and ids; the text is the incremental
  detokenization of the ids, holding back an unfinished UTF-8 character as
  the engine's detokenizer does), then `flush_tool_call_stream` as the server
  does at the finish; returns the reassembled content and calls, after
  checking each delta is well formed (a call's first delta has id, type and
  name; later ones only add arguments; indexes count up from 0).
- `run_nonstreaming(parser, text)`: extract_tool_calls as (content, calls).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.utils import flush_tool_call_stream

Call = tuple[str, str]  # (name, arguments JSON text)

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def make_request(tools: Sequence[dict[str, Any]] = (WEATHER_TOOL,), **kwargs: Any):
    """A chat request with `tools` (tool_choice "auto"), as the server passes it."""
    return ChatCompletionRequest(
        model="test",
        messages=[{"role": "user", "content": "hi"}],
        tools=list(tools) or None,
        **kwargs,
    )


@functools.cache
def _train_tokenizer(special_tokens: tuple[str, ...], corpus: tuple[str, ...], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) or ["hello world"], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    fast.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    return fast


def make_tokenizer(
    special_tokens: Sequence[str] = (), corpus: Sequence[str] = (), vocab_size: int = 400
):
    """A small real tokenizer (cached per arguments); see the module docstring."""
    return _train_tokenizer(tuple(special_tokens), tuple(corpus), vocab_size)


@functools.cache
def embedded_tokenizer():
    """The embedded SmolLM2-135M-Instruct tokenizer (no <tool_call> tokens)."""
    from vllm.transformers_utils.config import embedded_model_path
    from vllm.transformers_utils.tokenizer import get_tokenizer

    return get_tokenizer(embedded_model_path())


@dataclass
class StreamedResult:
    content: str = ""
    calls: list[list[str]] = field(default_factory=list)  # [name, arguments] per index
    deltas: list[Any] = field(default_factory=list)

    def call_tuples(self) -> list[Call]:
        return [(name, args) for name, args in self.calls]


def _add_delta(result: StreamedResult, delta: Any) -> None:
    result.deltas.append(delta)
    if delta.content:
        result.content += delta.content
    for tc in delta.tool_calls:
        fn = tc.function
        if tc.index == len(result.calls):  # a new call: id, type and name first
            assert tc.id and tc.type == "function", f"new call without id/type: {tc}"
            assert fn is not None and fn.name, f"new call without a name: {tc}"
            result.calls.append([fn.name, fn.arguments or ""])
        else:
            assert 0 <= tc.index < len(result.calls), f"call index out of order: {tc}"
            assert tc.id is None and (fn is None or fn.name is None), f"call renamed: {tc}"
            result.calls[tc.index][1] += (fn.arguments if fn else None) or ""


def detokenized_steps(tokenizer, ids: Sequence[int], chunks: Sequence[int]):
    """(delta_ids, current_ids, current_text) per step. `chunks` gives each
    step's token count (cycled until the ids run out)."""
    steps, start, k = [], 0, 0
    text = ""
    while start < len(ids):
        stop = min(len(ids), start + chunks[k % len(chunks)])
        decoded = tokenizer.decode(list(ids[:stop]), skip_special_tokens=False)
        if stop < len(ids) and decoded.endswith("\ufffd"):
            decoded = text  # an unfinished UTF-8 character: hold, as the engine does
        assert decoded.startswith(text), "detokenization is not incremental"
        text = decoded
        steps.append((list(ids[start:stop]), list(ids[:stop]), text))
        start, k = stop, k + 1
    return steps


def run_streaming(
    parser: ToolParser,
    tokenizer,
    text: str,
    chunks: Sequence[int] = (1,),
    request: ChatCompletionRequest | None = None,
) -> StreamedResult:
    """Stream `text` through `parser` (see the module docstring)."""
    request = request if request is not None else make_request()
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text, "tokenizer round trip"
    result = StreamedResult()
    prev_text, prev_ids = "", []
    for delta_ids, cur_ids, cur_text in detokenized_steps(tokenizer, ids, chunks):
        delta = parser.extract_tool_calls_streaming(
            previous_text=prev_text,
            current_text=cur_text,
            delta_text=cur_text[len(prev_text) :],
            previous_token_ids=prev_ids,
            current_token_ids=cur_ids,
            delta_token_ids=delta_ids,
            request=request,
        )
        if delta is not None:
            _add_delta(result, delta)
        prev_text, prev_ids = cur_text, cur_ids
    final = flush_tool_call_stream(parser, prev_text, request)
    if final is not None:
        _add_delta(result, final)
    return result


def run_nonstreaming(
    parser: ToolParser, text: str, request: ChatCompletionRequest | None = None
) -> tuple[str | None, list[Call], bool]:
    """extract_tool_calls as (content, [(name, arguments)], tools_called)."""
    info = parser.extract_tool_calls(text, request if request is not None else make_request())
    calls = [(c.function.name, c.function.arguments) for c in info.tool_calls]
    assert info.tools_called == bool(calls)
    return info.content, calls, info.tools_called


def chunkings(seed: int = 0, n_random: int = 3, max_chunk: int = 6) -> list[list[int]]:
    """Step sizes to stream with: one token per step, everything at once, and
    `n_random` seeded random multi-token patterns."""
    rng = random.Random(seed)
    random_ones = [[rng.randint(1, max_chunk) for _ in range(64)] for _ in range(n_random)]
    return [[1], [1 << 30], *random_ones]
