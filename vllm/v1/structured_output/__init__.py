"""Structured outputs: compile each request's constraint into a grammar and
build the per-step token bitmask (upstream: vllm/v1/structured_output/).

The manager lives in the engine core process next to the scheduler. Grammars
compile in a small thread pool, so a slow compilation never blocks the
engine loop; the scheduler leaves a request waiting until its grammar is
ready (or failed: `compile_error`).

With a reasoning parser (`structured_outputs_config.reasoning_parser`, set by
`--reasoning-parser`) the grammar constrains only what follows the reasoning
(upstream's contract):

    should_fill_bitmask   the first time: reasoning_ended = the parser's
                          is_reasoning_end(prompt ids) unless the request came
                          with EngineCoreRequest.reasoning_ended; then the
                          bitmask applies iff the reasoning has ended
    should_advance        while not ended, asks is_reasoning_end_streaming on
                          each step's new tokens; the step that ends it (the
                          end marker) is not fed to the grammar, every later
                          token is

`enable_in_reasoning=True` applies the grammar from the first token anyway.

What the front end sets per request (`AsyncLLM.generate` / `LLMEngine.add_request`
keyword arguments, carried by `EngineCoreRequest`):

- `reasoning_parser_kwargs={"chat_template_kwargs": request.chat_template_kwargs}`:
  the engine core builds this request's parser with them, so
  `{"enable_thinking": False}` makes qwen3's `is_reasoning_end` true from the
  start and the grammar applies from the first generated token.
- `reasoning_ended=True` when the front end knows the prompt leaves no reasoning
  to do (e.g. its own parser's `is_reasoning_end(prompt_token_ids)`, or
  reasoning switched off); None lets the engine's parser decide from the prompt.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.v1.structured_output.backend_types import StructuredOutputBackend, StructuredOutputGrammar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.config import VllmConfig
    from vllm.reasoning import ReasoningParser
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.request import Request

logger = init_logger(__name__)

# Compilations in flight at once: each holds xgrammar's compiler threads
# too, and the engine shares the machine with the model.
_MAX_COMPILE_WORKERS = 2


class StructuredOutputManager:
    """Engine-side structured output state: the backend (built on first use),
    the compile thread pool and the bitmask buffer."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.backend: StructuredOutputBackend | None = None
        self._tokenizer: TokenizerLike | None = None
        self._grammar_bitmask: torch.Tensor | None = None
        self._executor: ThreadPoolExecutor | None = None
        so_config = vllm_config.structured_outputs_config
        self.enable_in_reasoning = so_config.enable_in_reasoning
        # The reasoning parser's class (None: grammars apply from the first
        # token); its shared instance is built with the tokenizer on first use.
        self.reasoner_cls: type[ReasoningParser] | None = None
        self._reasoner: ReasoningParser | None = None
        if so_config.reasoning_parser:
            self.reasoner_cls = _reasoning_parser_class(
                so_config.reasoning_parser, so_config.reasoning_parser_plugin
            )

    # ---- lazily built parts ------------------------------------------------------------
    @property
    def tokenizer(self) -> TokenizerLike:
        """The engine's tokenizer (the same loader, GGUF files included)."""
        if self._tokenizer is None:
            model_config = self.vllm_config.model_config
            if model_config is None or model_config.skip_tokenizer_init:
                raise ValueError(
                    "Structured outputs need a tokenizer; they are not "
                    "supported with skip_tokenizer_init=True."
                )
            from vllm.transformers_utils.tokenizer import cached_tokenizer_from_config

            self._tokenizer = cached_tokenizer_from_config(model_config)
        return self._tokenizer

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            workers = max(1, min(_MAX_COMPILE_WORKERS, (os.cpu_count() or 1) // 2))
            self._executor = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="grammar-compile"
            )
        return self._executor

    def _init_backend(self, backend_name: str | None) -> StructuredOutputBackend:
        from vllm.config.structured_outputs import verify_backend_name

        name = backend_name or self.vllm_config.structured_outputs_config.backend
        verify_backend_name(name)
        # Every built name ("auto", "xgrammar") resolves to xgrammar.
        from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

        assert self.vllm_config.model_config is not None
        vocab_size = self.vllm_config.model_config.get_vocab_size()
        return XgrammarBackend(self.vllm_config, tokenizer=self.tokenizer, vocab_size=vocab_size)

    # ---- per request --------------------------------------------------------------------
    def grammar_init(self, request: Request) -> None:
        """Start compiling the request's grammar in the thread pool."""
        so_request = request.structured_output_request
        if so_request is None:
            return
        try:
            if self.backend is None:
                self.backend = self._init_backend(so_request.params._backend)
        except Exception as e:  # noqa: BLE001 - reported on the request, engine stays up
            logger.error("Structured output backend failed to start: %s", e)
            so_request.compile_error = f"{type(e).__name__}: {e}"
            return
        so_request.grammar = self.executor.submit(self._create_grammar, request)

    def _create_grammar(self, request: Request) -> StructuredOutputGrammar:
        so_request = request.structured_output_request
        assert so_request is not None and self.backend is not None
        request_type, grammar_spec = so_request.structured_output_key
        return self.backend.compile_grammar(request_type, grammar_spec, params=so_request.params)

    def should_advance(self, request: Request, new_token_ids: Sequence[int] = ()) -> bool:
        """Whether the request's new tokens (`new_token_ids`, the last of its
        tokens) must be fed to its grammar: not while it reasons, nor the
        tokens that end the reasoning."""
        so_request = request.structured_output_request
        if so_request is None or so_request.grammar is None:
            return False
        if self.reasoner_cls is None or self.enable_in_reasoning:
            return True
        if so_request.reasoning_ended is None:
            self.should_fill_bitmask(request)
        if so_request.reasoning_ended:
            return True
        reasoner = self._reasoner_for(request)
        if reasoner.is_reasoning_end_streaming(request.all_token_ids, list(new_token_ids)):
            # The grammar starts with the next token.
            so_request.reasoning_ended = True
        return False

    def should_fill_bitmask(self, request: Request) -> bool:
        """Whether the request's logits are constrained this step."""
        so_request = request.structured_output_request
        if so_request is None:
            return False
        if self.reasoner_cls is None or self.enable_in_reasoning:
            return True
        if so_request.reasoning_ended is None:
            reasoner = self._reasoner_for(request)
            so_request.reasoning_ended = reasoner.is_reasoning_end(request.prompt_token_ids)
        return so_request.reasoning_ended

    def _reasoner_for(self, request: Request) -> ReasoningParser:
        """The request's reasoning parser: its own when it came with
        reasoning_parser_kwargs (built once), else the shared one."""
        assert self.reasoner_cls is not None
        so_request = request.structured_output_request
        assert so_request is not None
        if so_request.reasoner is None and so_request.reasoning_parser_kwargs:
            try:
                so_request.reasoner = self.reasoner_cls(
                    self.tokenizer, **so_request.reasoning_parser_kwargs
                )
            except Exception as e:  # noqa: BLE001 - a request's kwargs never stop the engine
                logger.warning(
                    "Request %s: reasoning parser kwargs %r refused (%s); using the defaults.",
                    request.request_id,
                    so_request.reasoning_parser_kwargs,
                    e,
                )
                so_request.reasoning_parser_kwargs = None
        if so_request.reasoner is not None:
            return so_request.reasoner
        if self._reasoner is None:
            self._reasoner = self.reasoner_cls(self.tokenizer)
        return self._reasoner

    # ---- per step -----------------------------------------------------------------------
    def grammar_bitmask(
        self,
        requests: dict[str, Request],
        structured_output_request_ids: list[str],
        scheduled_spec_decode_tokens: dict[str, list[int]],
    ) -> np.ndarray | None:
        """int32 [rows, ceil(vocab / 32)]: one row per position to sample of
        each id in order (1 + its scheduled drafts). None when there is
        nothing to constrain."""
        if not structured_output_request_ids:
            return None
        assert self.backend is not None, "grammar_bitmask before any grammar_init"
        rows = sum(
            1 + len(scheduled_spec_decode_tokens.get(r, ())) for r in structured_output_request_ids
        )
        max_rows = self.vllm_config.scheduler_config.max_num_seqs
        if self._grammar_bitmask is None or self._grammar_bitmask.shape[0] < rows:
            self._grammar_bitmask = self.backend.allocate_token_bitmask(max(rows, max_rows))
        bitmask = self._grammar_bitmask
        index = 0
        for req_id in structured_output_request_ids:
            request = requests[req_id]
            so_request = request.structured_output_request
            grammar = so_request.grammar if so_request is not None else None
            apply = grammar is not None and self.should_fill_bitmask(request)
            advanced = 0
            # Each draft token's row is the mask after the tokens before it.
            for token in [*scheduled_spec_decode_tokens.get(req_id, ()), None]:
                if apply:
                    assert grammar is not None
                    grammar.fill_bitmask(bitmask, index)
                    # -1: a draft its grammar ruled out (async scheduling:
                    # Scheduler.update_draft_token_ids_in_output); skipped.
                    if (
                        token is not None
                        and token >= 0
                        and not grammar.is_terminated()
                        and grammar.accept_tokens(req_id, [token])
                    ):
                        advanced += 1
                else:
                    bitmask[index].fill_(-1)  # all allowed
                index += 1
            if advanced:
                assert grammar is not None
                grammar.rollback(advanced)
        # A copy: the buffer is reused next step while the workers may still
        # hold this array (in-process executors share memory).
        return bitmask[:index].numpy().copy()

    def clear_backend(self) -> None:
        """Free the backend (its compiled-grammar cache) and the compile threads."""
        if self.backend is not None:
            self.backend.destroy()
            self.backend = None
        self._grammar_bitmask = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _reasoning_parser_class(name: str, plugin: str) -> type[ReasoningParser]:
    """The parser class registered as `name`, importing `plugin` first when
    `name` is not known in this process (the engine core has its own
    registry)."""
    from vllm.config.structured_outputs import verify_reasoning_parser
    from vllm.reasoning import ReasoningParserManager

    if name not in ReasoningParserManager.list_registered():
        verify_reasoning_parser(name, plugin)
    return ReasoningParserManager.get_reasoning_parser(name)
