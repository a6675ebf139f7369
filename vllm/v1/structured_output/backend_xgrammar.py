"""The xgrammar grammar backend (upstream:
vllm/v1/structured_output/backend_xgrammar.py).

xgrammar compiles a constraint against the tokenizer's vocabulary once
(cached, bounded) and a GrammarMatcher per request walks it token by token,
writing the allowed next tokens as a bitmask (int32 words, bit j = token j).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from vllm.logger import init_logger
from vllm.utils.json_schema import check_json_schema_depth
from vllm.v1.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)
from vllm.v1.structured_output.utils import choice_as_grammar, grammar_is_likely_lark

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

logger = init_logger(__name__)

# The compiled-grammar cache is bounded: upstream's VLLM_XGRAMMAR_CACHE_MB,
# default 512 MiB. Each entry holds a per-token-state mask table, so unique
# schemas (one per request in some workloads) would otherwise grow it forever.
_DEFAULT_CACHE_MB = 512
# Compiler threads per compilation (the engine also compiles in a pool).
_COMPILER_THREADS = 2

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: ".
_CPP_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def _cache_limit_bytes() -> int:
    return int(os.environ.get("VLLM_XGRAMMAR_CACHE_MB", _DEFAULT_CACHE_MB)) * 1024 * 1024


def _clean_error(err: BaseException) -> str:
    """xgrammar's message without the C++ source location."""
    return _CPP_PREFIX.sub("", str(err).strip()).replace(
        "Check failed: (error.empty()) is false: ", ""
    )


@dataclass
class XgrammarBackend(StructuredOutputBackend):
    """Compiles constraints with one xgrammar GrammarCompiler per engine."""

    # Bound of the compiled-grammar cache (least recently used entries go first).
    cache_limit_bytes: int = field(default_factory=_cache_limit_bytes)
    compiler: xgr.GrammarCompiler = field(init=False)
    tokenizer_info: xgr.TokenizerInfo = field(init=False)

    def __post_init__(self) -> None:
        so_config = self.vllm_config.structured_outputs_config
        self.disable_any_whitespace = so_config.disable_any_whitespace
        # vocab_size is the logits width; ids past the tokenizer's vocabulary
        # (padding of the embedding table) are never allowed by xgrammar.
        if not isinstance(self.tokenizer, PreTrainedTokenizerBase):
            raise TypeError(
                "The xgrammar backend reads a Hugging Face tokenizer's vocabulary; "
                f"got {type(self.tokenizer).__name__}."
            )
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size
        )
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info,
            max_threads=_COMPILER_THREADS,
            cache_enabled=True,
            cache_limit_bytes=self.cache_limit_bytes,
        )

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        *,
        params: StructuredOutputsParams | None = None,
    ) -> XgrammarGrammar:
        try:
            ctx = self._compile(request_type, grammar_spec, params)
        except ValueError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError from C++
            raise ValueError(
                f"Invalid {request_type.name.lower()} constraint: {_clean_error(e)}"
            ) from e
        return XgrammarGrammar(matcher=xgr.GrammarMatcher(ctx), ctx=ctx, vocab_size=self.vocab_size)

    def _compile(
        self,
        request_type: StructuredOutputOptions,
        spec: str,
        params: StructuredOutputsParams | None,
    ) -> xgr.CompiledGrammar:
        opts = StructuredOutputOptions
        if request_type == opts.JSON:
            return self.compiler.compile_json_schema(spec, **self._json_kwargs(params))
        if request_type == opts.JSON_OBJECT:
            # An object, as upstream and OpenAI's json_object mode: xgrammar's
            # builtin JSON grammar would also admit a top-level array.
            return self.compiler.compile_json_schema(
                '{"type": "object"}', **self._json_kwargs(params)
            )
        if request_type == opts.REGEX:
            return self.compiler.compile_regex(spec)
        if request_type == opts.GRAMMAR:
            if grammar_is_likely_lark(spec):
                return self.compiler.compile_lark(spec)
            return self.compiler.compile_grammar(spec)
        if request_type == opts.CHOICE:
            return self.compiler.compile_grammar(choice_as_grammar(json.loads(spec)))
        if request_type == opts.STRUCTURAL_TAG:
            return self.compiler.compile_structural_tag(*_structural_tag_args(spec))
        raise ValueError(f"Unsupported structured output kind {request_type!r}")

    def _json_kwargs(self, params: StructuredOutputsParams | None) -> dict[str, Any]:
        """compile_json_schema options from the config and the request."""
        if params is not None and params.whitespace_pattern is not None:
            raise ValueError(
                "whitespace_pattern is not supported by the xgrammar backend; "
                "use disable_any_whitespace instead."
            )
        no_ws = self.disable_any_whitespace or bool(params and params.disable_any_whitespace)
        # xgrammar's strict mode (its default, as upstream keeps it) already
        # forbids properties the schema does not list; disable_additional_properties
        # asks for exactly that.
        return {"any_whitespace": not no_ws, "strict_mode": True}

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(max_num_seqs, self.vocab_size)

    def destroy(self) -> None:
        self.compiler.clear_cache()

    def cache_size_bytes(self) -> int:
        """Bytes held by the compiled-grammar cache."""
        return self.compiler.get_cache_size_bytes()


def _structural_tag_args(spec: str) -> tuple[Any, ...]:
    """compile_structural_tag's arguments: upstream's legacy form
    {"structures": [{"begin", "schema", "end"}], "triggers": [...]}, or
    xgrammar's own structural tag JSON."""
    try:
        tag = json.loads(spec)
    except json.JSONDecodeError as e:
        raise ValueError(f"structural_tag must be JSON: {e}") from e
    except RecursionError as e:
        raise ValueError("The structural tag is nested too deeply.") from e
    check_json_schema_depth(tag)  # its schemas cost as much as a json constraint's
    if isinstance(tag, dict) and "structures" in tag:
        try:
            items = [
                xgr.StructuralTagItem(
                    begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"]
                )
                for s in tag["structures"]
            ]
            return items, list(tag["triggers"])
        except (KeyError, TypeError) as e:
            raise ValueError(
                "structural_tag 'structures' entries need 'begin', 'schema' and "
                f"'end', and a 'triggers' list: {e}"
            ) from e
    return (spec,)


@dataclass
class XgrammarGrammar(StructuredOutputGrammar):
    """One request's position in its grammar."""

    matcher: xgr.GrammarMatcher
    ctx: xgr.CompiledGrammar
    vocab_size: int
    num_processed_tokens: int = 0
    _is_terminated: bool = False

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance by `tokens`. Once terminated only stop tokens are accepted
        (a request with ignore_eos keeps producing EOS)."""
        for i, token in enumerate(tokens):
            if self._is_terminated:
                if token not in self.matcher.stop_token_ids:
                    return False
                continue
            if not self.matcher.accept_token(token):
                logger.error(
                    "Grammar of request %s rejected token %d (at %d of %s).",
                    request_id,
                    token,
                    i,
                    tokens,
                )
                return False
            self.num_processed_tokens += 1
            self._is_terminated = self.matcher.is_terminated()
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        accepted: list[int] = []
        if self._is_terminated:
            return accepted
        for token in tokens:
            if not self.matcher.accept_token(token):
                break
            accepted.append(token)
        if accepted:
            self.matcher.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self.matcher.rollback(num_tokens)
        self.num_processed_tokens -= num_tokens
        self._is_terminated = self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        if not self._is_terminated:
            self.matcher.fill_next_token_bitmask(bitmask, idx)
            return
        # xgrammar refuses to fill after the stop token: the row allows only
        # the stop tokens, so the request ends on EOS (or repeats it with ignore_eos).
        row = bitmask[idx]
        row.zero_()
        for token in self.matcher.stop_token_ids:
            row[token // 32] |= _bit(token % 32)

    def is_terminated(self) -> bool:
        return self._is_terminated

    def reset(self) -> None:
        self.num_processed_tokens = 0
        self.matcher.reset()
        self._is_terminated = False


def _bit(pos: int) -> int:
    """Bit `pos` of an int32 word as a signed value (bit 31 is negative)."""
    return (1 << pos) - (1 << 32 if pos == 31 else 0)


def validate_xgrammar_grammar(sampling_params: SamplingParams) -> None:
    """ValueError, with xgrammar's reason, for a constraint xgrammar cannot
    compile. Converts the spec to a grammar without a tokenizer (quick; a
    regex like (a+)+b is converted, not executed, so it cannot hang)."""
    so = sampling_params.structured_outputs
    if so is None:
        return
    try:
        _check_spec(so)
    except ValueError:
        raise
    except Exception as e:  # xgrammar raises RuntimeError from C++
        kind = next(
            k
            for k in ("json", "regex", "choice", "grammar", "structural_tag", "json_object")
            if getattr(so, k) not in (None, False)
        )
        raise ValueError(f"Invalid structured_outputs.{kind}: {_clean_error(e)}") from e


def _check_spec(so: StructuredOutputsParams) -> None:
    if so.json is not None:
        schema = so.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"Invalid JSON schema (not JSON): {e}") from e
            except RecursionError as e:
                raise ValueError("The JSON schema is nested too deeply.") from e
        check_json_schema_depth(schema)
        if so.whitespace_pattern is not None:
            raise ValueError(
                "whitespace_pattern is not supported by the xgrammar backend; "
                "use disable_any_whitespace instead."
            )
        xgr.Grammar.from_json_schema(so.json_str or "")
    elif so.regex is not None:
        xgr.Grammar.from_regex(so.regex)
    elif so.choice:
        xgr.Grammar.from_ebnf(choice_as_grammar(so.choice))
    elif so.grammar is not None:
        if grammar_is_likely_lark(so.grammar):
            xgr.Grammar.from_lark(so.grammar)
        else:
            xgr.Grammar.from_ebnf(so.grammar)
    elif so.structural_tag is not None:
        xgr.Grammar.from_structural_tag(*_structural_tag_args(so.structural_tag))
