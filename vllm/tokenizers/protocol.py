"""`TokenizerLike`: the tokenizer surface the engine and the front end use.

Upstream: vllm/tokenizers/protocol.py. Tokenizers here are Hugging Face
tokenizers (loaded by vllm/transformers_utils/tokenizer.py, GGUF files
included), but callers are typed against this protocol rather than
`transformers.PreTrainedTokenizerBase`, so a test double or another backend
only has to provide what is listed. The list is what our code calls, nothing
more: add a member here when a caller starts using one.

A leaf module: it imports nothing from vllm, so any layer may name it
(at run time or under TYPE_CHECKING) without creating an import cycle.
"""

from __future__ import annotations

from typing import Any, Protocol


class TokenizerLike(Protocol):
    # -- vocabulary ---------------------------------------------------------

    @property
    def eos_token_id(self) -> int | None:
        raise NotImplementedError

    @property
    def all_special_ids(self) -> list[int]:
        raise NotImplementedError

    @property
    def all_special_tokens(self) -> list[str]:
        raise NotImplementedError

    def __len__(self) -> int:
        """Vocabulary size, added tokens included."""
        raise NotImplementedError

    def get_vocab(self) -> dict[str, int]:
        raise NotImplementedError

    def get_added_vocab(self) -> dict[str, int]:
        raise NotImplementedError

    # -- text <-> ids -------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int], skip_special_tokens: bool = False, **kwargs: Any) -> str:
        raise NotImplementedError

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        raise NotImplementedError

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        raise NotImplementedError

    # -- chat ---------------------------------------------------------------

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The rendered text with `tokenize=False` (how chat_utils calls it)."""
        raise NotImplementedError
