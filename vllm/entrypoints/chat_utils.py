"""Rendering chat conversations with the tokenizer's chat template
(upstream: vllm/entrypoints/chat_utils.py, text-only).

    conversation = [{"role": "user", "content": "Hi"}]
    text = apply_hf_chat_template(tokenizer, conversation, chat_template=None,
                                  tools=None, add_generation_prompt=True)

Message content may be a string or OpenAI-style parts
(`[{"type": "text", "text": ...}]`). Templates differ in what they expect:
"string" templates read `message.content` as text (parts are joined with
newlines), "openai" templates loop over the parts. "auto" looks at the
template source to decide. Only text parts are supported (no multimodal).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

ChatCompletionMessageParam = dict[str, Any]
ChatTemplateContentFormatOption = Literal["auto", "string", "openai"]

# Arguments of the render call itself: a request must not override them
# through chat_template_kwargs (upstream security fix GHSA-69j4-grxj-j64p).
_RESERVED_TEMPLATE_KWARGS = frozenset({"chat_template", "tokenize"})

# `for part in message['content']` / `message.content` loops, i.e. a template
# that walks OpenAI-style content parts.
_CONTENT_LOOP_RE = re.compile(
    r"\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[\s*['\"]content['\"]\s*\]|\.content)"
)


class ChatTemplateResolutionError(ValueError):
    """No chat template: neither given nor defined by the tokenizer."""


def resolve_hf_chat_template(tokenizer: TokenizerLike, chat_template: str | None) -> str:
    """The template to render with: the one given, else the tokenizer's."""
    template = (
        chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    )
    if isinstance(template, dict):  # named templates: use the default one
        template = template.get("default")
    if not template:
        raise ChatTemplateResolutionError(
            "As of transformers v4.44, default chat template is no longer allowed, so you "
            "must provide a chat template if the tokenizer does not define one."
        )
    return template


def resolve_chat_template_content_format(
    chat_template: str, given: ChatTemplateContentFormatOption
) -> Literal["string", "openai"]:
    if given != "auto":
        return given
    return "openai" if _CONTENT_LOOP_RE.search(chat_template) else "string"


@lru_cache(maxsize=32)
def _template_variables(chat_template: str) -> frozenset[str]:
    """Names the template reads from its context (jinja's undeclared variables)."""
    import jinja2
    import jinja2.meta

    try:
        ast = jinja2.Environment().parse(chat_template)
    except jinja2.TemplateSyntaxError:
        return frozenset()  # the render will report the error
    return frozenset(jinja2.meta.find_undeclared_variables(ast))


def resolve_chat_template_kwargs(
    chat_template: str, chat_template_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The extra kwargs the template can use; reserved render arguments are an
    error, names the template never reads are dropped (as upstream)."""
    unexpected = _RESERVED_TEMPLATE_KWARGS & chat_template_kwargs.keys()
    if unexpected:
        raise ValueError(f"Found unexpected chat template kwargs from request: {unexpected}")
    accepted = _template_variables(chat_template)
    return {k: v for k, v in chat_template_kwargs.items() if k in accepted}


def parse_chat_messages(
    messages: list[ChatCompletionMessageParam], content_format: Literal["string", "openai"]
) -> list[ChatCompletionMessageParam]:
    """Copies of the messages with their content in the template's format."""
    conversation = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"Each chat message must be a dict with a 'role', got {message!r}")
        parsed = dict(message)
        content = message.get("content")
        if content is None:  # e.g. an assistant turn that only called tools: ""
            content = []
        if message["role"] == "assistant":
            _parse_assistant_extras(parsed)
        if isinstance(content, list):
            texts = [_text_of_part(part) for part in content]
            parsed["content"] = (
                "\n".join(texts)
                if content_format == "string"
                else [{"type": "text", "text": t} for t in texts]
            )
        elif isinstance(content, str) and content_format == "openai":
            parsed["content"] = [{"type": "text", "text": content}]
        conversation.append(parsed)
    return conversation


def _parse_assistant_extras(message: ChatCompletionMessageParam) -> None:
    """As upstream: a call's `arguments` (OpenAI sends JSON text) reach the
    template as a dict, as tool-use templates expect; the earlier turn's
    reasoning is given under both of upstream's names."""
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        message["tool_calls"] = [_template_tool_call(call) for call in calls]
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning is not None:
        message["reasoning"] = message["reasoning_content"] = reasoning


def _template_tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"Each assistant tool call needs a `function` with a `name`, got {call!r}")
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise ValueError(
                f"The arguments of tool call {function['name']!r} are not valid JSON: {e}"
            ) from e
    elif not arguments:
        arguments = {}
    return {**call, "function": {**function, "arguments": arguments}}


def _text_of_part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type", "text") == "text" and "text" in part:
        return part["text"]
    raise ValueError(f"Unsupported content part {part!r}: only text parts are supported.")


def apply_hf_chat_template(
    tokenizer: TokenizerLike,
    conversation: list[ChatCompletionMessageParam],
    chat_template: str | None,
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_content_format: ChatTemplateContentFormatOption = "auto",
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render `conversation` to the prompt text (not tokenized).

    Raises ValueError for a missing template, conflicting flags, reserved
    kwargs and template errors (the caller's fault, HTTP 400 in a server).
    """
    if add_generation_prompt and continue_final_message:
        raise ValueError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    template = resolve_hf_chat_template(tokenizer, chat_template)
    content_format = resolve_chat_template_content_format(template, chat_template_content_format)
    extra = resolve_chat_template_kwargs(template, chat_template_kwargs or {})
    try:
        return tokenizer.apply_chat_template(
            parse_chat_messages(conversation, content_format),
            tools=tools,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **extra,
        )
    except Exception as e:
        # jinja errors (TemplateError, raise_exception(...)) are bad input.
        raise ValueError(str(e)) from e


def load_chat_template(chat_template: str | None) -> str | None:
    """`--chat-template`: a file path, or the template text itself.

    A value that names no file and contains no jinja markup is most likely a
    mistyped path: that is an error rather than a template.
    """
    import os

    if chat_template is None:
        return None
    if os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as f:
            return f.read()
    if any(c in chat_template for c in "{}\n"):
        # Escape sequences from the command line: "\n" typed as two characters.
        if chat_template.isascii():
            return chat_template.encode("ascii").decode("unicode_escape")
        return chat_template
    raise ValueError(
        f"The supplied chat template ({chat_template}) looks like a file path, "
        "but it failed to be opened."
    )
