"""The lower bound on a prompt's token count that lets the server refuse a
text before tokenizing it (vllm/entrypoints/openai/request_limits.py): sound
(never above the real count) for the tokenizers it accepts, refused for those
where a token may cover unboundedly much text; the body-limit default; the
JSON-schema depth check (no server: fast)."""

from __future__ import annotations

import random
import sys
import unicodedata

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tests.utils import make_tiny_tokenizer
from vllm.entrypoints.openai.request_limits import (
    MAX_CANONICAL_DECOMPOSITION,
    MIN_DEFAULT_BODY_BYTES,
    PromptLengthBound,
    check_prompt_text_length,
    default_max_request_body_bytes,
)
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams
from vllm.utils.json_schema import MAX_JSON_SCHEMA_DEPTH, check_json_schema_depth

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Ünïcödé テキスト 😀 "
    "spaces    and\ttabs\nnew lines, café, 한국어, ﬁ ligature, Å Ω. "
) * 20
# Characters chosen to stress each stage: long runs, control bytes, combining
# marks and Hangul jamo (NFC composes them), compatibility forms (NFKC).
ALPHABET = list("ab c\t\n.ﬁ😀é") + [
    "e\u0301",
    "\u1100\u1161\u11a8",
    "\x06",
    "    ",
    "aaaaaaaa",
    "<|endoftext|>",
    "Ａ",
]


def fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def byte_level_bpe(normalizer=None, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [CORPUS],
        trainer=trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return fast(tok)


def sentencepiece_bpe() -> PreTrainedTokenizerFast:
    """Llama-2 style: Prepend + Replace(" " -> "▁") normalizer, byte fallback."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(
        [CORPUS.replace(" ", "▁")],
        trainer=trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<unk>", "<|endoftext|>", *byte_tokens],
            max_token_length=16,
            show_progress=False,
        ),
    )
    return fast(tok)


def wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.train_from_iterator(
        [CORPUS],
        trainer=trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False
        ),
    )
    return fast(tok)


def assert_sound(tokenizer, bound: PromptLengthBound, seed: int = 0) -> None:
    rnd = random.Random(seed)
    for _ in range(300):
        text = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 120)))
        actual = len(tokenizer.encode(text, add_special_tokens=False))
        assert bound.min_tokens(text) <= actual, (text, bound, actual)


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: make_tiny_tokenizer(str(tmp)),
        lambda tmp: byte_level_bpe(),
        lambda tmp: byte_level_bpe(normalizers.NFC()),
        lambda tmp: byte_level_bpe(normalizers.NFKC()),
        lambda tmp: byte_level_bpe(normalizers.Lowercase()),
        lambda tmp: sentencepiece_bpe(),
    ],
    ids=["test-tokenizer", "byte-level", "nfc", "nfkc", "lowercase", "sentencepiece"],
)
def test_bound_is_sound_and_useful(tmp_path, make):
    tokenizer = make(tmp_path)
    bound = PromptLengthBound.from_tokenizer(tokenizer)
    assert bound.bytes_per_token is not None, bound.reason
    assert_sound(tokenizer, bound)
    # And it proves something: a long text is known too long without tokenizing.
    assert bound.min_tokens("a" * 10**6) > 10**6 // 1000


def test_byte_level_vocabulary_missing_control_bytes():
    """A byte-level vocabulary without some control bytes (SmolLM2's lacks
    six) drops those characters: they are counted out, not assumed to be a
    token each."""
    tokenizer = byte_level_bpe()
    backend = tokenizer.backend_tokenizer
    vocab = backend.get_vocab()
    missing = {"\u0106"}  # byte 0x06 in the ByteLevel alphabet
    kept = {tok: i for tok, i in vocab.items() if tok not in missing}
    # Rebuild without the token (ids need not be contiguous for the check).
    model = models.BPE(vocab={t: n for n, t in enumerate(sorted(kept, key=kept.get))}, merges=[])
    stripped = Tokenizer(model)
    stripped.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    stripped = fast(stripped)
    bound = PromptLengthBound.from_tokenizer(stripped)
    assert bound.dropped_chars == "\x06"
    assert len(stripped.encode("\x06" * 50, add_special_tokens=False)) == 0
    assert bound.min_tokens("\x06" * 50) == 0
    assert_sound(stripped, bound)


@pytest.mark.parametrize(
    "make,reason",
    [
        (wordpiece, "WordPiece"),
        (lambda: byte_level_bpe(normalizers.StripAccents()), "StripAccents"),
        (lambda: byte_level_bpe(normalizers.Replace(" ", "")), "Replace"),
    ],
)
def test_no_bound_where_a_token_may_cover_unbounded_text(make, reason):
    bound = PromptLengthBound.from_tokenizer(make())
    assert bound.bytes_per_token is None and reason in bound.reason
    assert bound.min_tokens("a" * 10**6) == 0  # nothing is refused early


def test_whitespace_absorbing_added_token_gives_no_bound():
    tokenizer = byte_level_bpe()
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken("<mask>", lstrip=True)])
    assert PromptLengthBound.from_tokenizer(tokenizer).bytes_per_token is None


def test_canonical_decomposition_length():
    """The NFC/NFKC shrink factor rests on this fact of the Unicode tables."""
    longest = max(
        len(unicodedata.normalize("NFD", chr(c)))
        for c in range(0x110000)
        if not 0xD800 <= c < 0xE000
    )
    assert longest == MAX_CANONICAL_DECOMPOSITION


def test_check_prompt_text_length_messages(tmp_path):
    tokenizer = make_tiny_tokenizer(str(tmp_path))
    per_token = PromptLengthBound.from_tokenizer(tokenizer).bytes_per_token
    text = "a" * (per_token * 100)  # at least 100 tokens
    check_prompt_text_length(tokenizer, text, 200, 100)  # may fit: not refused here
    with pytest.raises(
        VLLMValidationError,
        match="'max_tokens' or 'max_completion_tokens' "
        "is too large: 101.*at least 100 input tokens",
    ):
        check_prompt_text_length(tokenizer, text, 200, 101)
    with pytest.raises(
        VLLMValidationError,
        match="maximum context length is 100 tokens. However, your request has at least 100",
    ):
        check_prompt_text_length(tokenizer, text, 100, None)
    check_prompt_text_length(tokenizer, text, 100, 0)  # /tokenize: exactly L is fine


def test_default_body_limit():
    assert default_max_request_body_bytes(512) == MIN_DEFAULT_BODY_BYTES
    assert default_max_request_body_bytes(2**20) == 128 * 2**20


def test_json_schema_depth():
    deep: object = {}
    for _ in range(10 * sys.getrecursionlimit()):
        deep = {"a": [deep]}
    with pytest.raises(ValueError, match="nested more than"):
        check_json_schema_depth(deep)  # iterative: no RecursionError
    ok: object = {"type": "string"}
    while True:
        wrapped = {"type": "object", "properties": {"a": ok}}
        try:
            check_json_schema_depth(wrapped)
        except ValueError:
            break
        ok = wrapped
    with pytest.raises(VLLMValidationError, match="nested more than"):
        StructuredOutputsParams(json=deep)
    StructuredOutputsParams(json=ok)  # the deepest accepted schema
    assert MAX_JSON_SCHEMA_DEPTH >= 64
