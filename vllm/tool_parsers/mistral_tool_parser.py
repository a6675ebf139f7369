"""Mistral tool calls (upstream: vllm/tool_parsers/mistral_tool_parser.py).

Two formats, told apart by the tokenizer as upstream does (a vocabulary with
`[ARGS]` is a v11+ tokenizer):
  before v11  content[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
  v11+        content[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}
              (`[ARGS]` may be absent from the text when special tokens are
              skipped; v13 adds `[CALL_ID]id` after the name: that id becomes
              the call's id)
`[TOOL_CALLS]` is found in the text, so it works whether the tokenizer has it
as a special token or not. Content is the text before the first call, as
upstream (text after the calls is dropped); arguments are re-serialized JSON.
A call whose text is not a name and a JSON object is not a call; an output
with no call is all content (`tools_called` False).
Tool call ids are 9 alphanumeric characters, as Mistral's templates require.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from random import choices
from string import ascii_letters, digits
from typing import TYPE_CHECKING, Any

from partial_json_parser.core.options import Allow
from pydantic import Field

from vllm.entrypoints.openai.protocol_responses import ToolCall
from vllm.tool_parsers._snapshot_stream import (
    STABLE_ALLOW,
    CallSnapshot,
    Snapshot,
    SnapshotStreamer,
    cached_vocab,
    complete_json,
    decode_first_json,
    json_arguments,
    json_prefix_len,
    to_extracted,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.utils import dump_arguments as dumps
from vllm.tool_parsers.utils import partial_marker_len

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.protocol_responses import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tokenizers.protocol import TokenizerLike

ALPHANUMERIC = ascii_letters + digits
_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"


class MistralToolCall(ToolCall):
    id: str = Field(default_factory=lambda: MistralToolCall.generate_random_id())

    @staticmethod
    def generate_random_id() -> str:
        # Mistral's chat templates accept only 9 alphanumeric characters.
        return "".join(choices(ALPHANUMERIC, k=9))

    @staticmethod
    def is_valid_id(id: str) -> bool:
        return id.isalnum() and len(id) == 9


def _is_pre_v11_tokeniser(tokenizer: TokenizerLike) -> bool:
    return _ARGS not in cached_vocab(tokenizer)


class MistralToolParser(ToolParser):
    """`--tool-call-parser mistral`."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        self.bot_token = "[TOOL_CALLS]"
        self.bot_token_id = cached_vocab(tokenizer).get(self.bot_token)
        self._is_pre_v11 = _is_pre_v11_tokeniser(tokenizer)
        self._streamer = SnapshotStreamer(MistralToolCall.generate_random_id)

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        # `[TOOL_CALLS]` is a special token: keep it in the text, as upstream.
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False
        return request

    # -- parsing ---------------------------------------------------------

    def snapshot(self, text: str, final: bool) -> Snapshot:
        """Content and calls of `text` (see _snapshot_stream)."""
        pieces = text.split(self.bot_token)
        content = pieces[0]
        if not final and len(pieces) == 1:
            return Snapshot(content[: len(content) - partial_marker_len(content, [self.bot_token])])
        segments = pieces[1:]
        calls: list[CallSnapshot] = []
        for i, segment in enumerate(segments):
            closed = final or i < len(segments) - 1
            if not closed:  # hold back what may be the start of the next call
                segment = segment[: len(segment) - partial_marker_len(segment, [self.bot_token])]
            if self._is_pre_v11:
                calls.extend(self._pre_v11_calls(segment, closed))
            else:
                call = self._v11_call(segment, closed)
                if call is not None:
                    calls.append(call)
        if not calls and not final:
            return Snapshot(content)  # a call may still come: hold the rest
        return Snapshot(content if calls else text, calls)

    def _v11_call(self, segment: str, closed: bool) -> CallSnapshot | None:
        """`name[CALL_ID]id[ARGS]{...}` (markers optional), or None."""
        brace = segment.find("{")
        if brace < 0:
            return None
        head, call_id = segment[:brace].replace(_ARGS, ""), None
        if _CALL_ID in head:
            head, call_id = head.split(_CALL_ID, 1)
            call_id = call_id.strip()
            if not MistralToolCall.is_valid_id(call_id):
                call_id = None  # Mistral's templates refuse it: a fresh id instead
        name = head.strip()
        if not _NAME.fullmatch(name):
            return None
        args = json_arguments(segment[brace:], closed)
        if args is None:
            return None
        return CallSnapshot(name, args[0], args[1], call_id)

    def _pre_v11_calls(self, segment: str, closed: bool) -> list[CallSnapshot]:
        """`[{"name": ..., "arguments": {...}}, ...]`; junk before the array
        is skipped, as upstream's regex fallback does."""
        start = segment.find("[")
        if start < 0:
            return []
        if segment[:start].strip() and "[{" in segment:
            start = segment.find("[{")
        body = segment[start:]
        whole = decode_first_json(body)
        if whole is not None:
            return _items_to_calls(whole[0], complete=True)
        return _partial_items(body, closed)

    # -- the two entry points ---------------------------------------------

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        snapshot = self.snapshot(model_output, final=True)
        return to_extracted(snapshot, model_output, MistralToolCall.generate_random_id)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        return self._streamer.step(self, self.snapshot(current_text, final=False))

    def finish_streaming(
        self, current_text: str, request: ChatCompletionRequest
    ) -> DeltaMessage | None:
        """What the stream still owes once the output is complete (called by
        utils.flush_tool_call_stream)."""
        return self._streamer.finish(self, self.snapshot(current_text, final=True), current_text)


def _items_to_calls(items: Any, complete: bool) -> list[CallSnapshot]:
    """Calls from a parsed list of {"name", "arguments"} objects; the last
    item's arguments are held open unless the list is complete."""
    if not isinstance(items, list):
        return []
    calls = []
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            break
        value = item.get("arguments", {})
        if isinstance(value, str):  # arguments given as a JSON string
            decoded = decode_first_json(value)
            value = decoded[0] if decoded is not None else None
        if not isinstance(value, dict):
            break
        text = dumps(value)
        if not complete and i == len(items) - 1:
            text = text.rstrip('"]}')
        calls.append(CallSnapshot(item["name"], text, value))
    return calls


def _partial_items(body: str, closed: bool) -> list[CallSnapshot]:
    """Calls of a cut-off array, read as far as it is JSON: while the array
    may grow, its last item counts once its name string is closed and its
    arguments object has begun."""
    allow = Allow.ALL if closed else STABLE_ALLOW
    body = body[: json_prefix_len(body, allow)]
    try:
        items = complete_json(body, allow)
    except ValueError:  # not an array at all: a malformed call
        return []
    if not isinstance(items, list):
        return []
    ready = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            break
        # The last item of a growing array waits while its name may grow or
        # its arguments may yet turn out not to be an object.
        if (
            i == len(items) - 1
            and not closed
            and (not isinstance(item.get("arguments"), dict) or _name_open(body, allow, item))
        ):
            break
        ready.append(item)
    return _items_to_calls(ready, complete=closed)


def _name_open(body: str, allow: Allow, item: dict[str, Any]) -> bool:
    """Whether the last item's name string is still open: one more character
    would change it (after a closed string it breaks the JSON instead)."""
    try:
        grown = complete_json(body + "x", allow)
    except ValueError:
        return False
    last = grown[-1] if isinstance(grown, list) and grown else None
    return not isinstance(last, dict) or last.get("name") != item["name"]
