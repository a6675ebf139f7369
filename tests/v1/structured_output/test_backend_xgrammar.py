"""The xgrammar backend on a byte-level tokenizer: every option compiles, its
first-token mask allows exactly the tokens the grammar allows, a matcher
walks to termination, errors are clear ValueErrors and the compiled-grammar
cache stays bounded."""

from __future__ import annotations

import json

import pytest
import torch

from tests.utils import TINY_VOCAB
from tests.v1.structured_output.conftest import PADDED_VOCAB
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.structured_output.backend_types import StructuredOutputOptions as Opt
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend, validate_xgrammar_grammar

EOS = 0


def allowed_ids(grammar, vocab: int = PADDED_VOCAB) -> set[int]:
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    bits = bitmask[0].tolist()
    return {t for t in range(vocab) if (bits[t // 32] >> (t % 32)) & 1}


def token_texts(tokenizer) -> dict[int, str]:
    """id -> decoded text of every ordinary (non-special, non-added) token."""
    added = set(tokenizer.get_added_vocab().values())
    return {i: tokenizer.decode([i]) for i in range(TINY_VOCAB) if i not in added}


def expected_first_tokens(tokenizer, language: list[str]) -> set[int]:
    """Tokens a finite language allows first: a non-empty prefix of a member
    (EOS when the empty string is a member)."""
    ids = {
        i
        for i, s in token_texts(tokenizer).items()
        if s and "\ufffd" not in s and any(w.startswith(s) for w in language)
    }
    return ids | ({EOS} if "" in language else set())


def drive(grammar, tokenizer, text: str) -> None:
    """Feed `text`'s tokens one by one, each allowed by the mask first."""
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert token in allowed_ids(grammar), (text, tokenizer.decode([token]))
        assert grammar.accept_tokens("r", [token])


def finish(grammar) -> None:
    """At a complete match only EOS is allowed; accepting it terminates."""
    assert allowed_ids(grammar) == {EOS}
    assert not grammar.is_terminated()
    assert grammar.accept_tokens("r", [EOS])
    assert grammar.is_terminated()
    assert allowed_ids(grammar) == {EOS}  # EOS-only row after termination


@pytest.mark.parametrize(
    "kind,spec,language",
    [
        (Opt.REGEX, "ab|cd|def", ["ab", "cd", "def"]),
        (
            Opt.CHOICE,
            json.dumps(["yes", "no", 'say "hi"\\', "a\nb"]),
            ["yes", "no", 'say "hi"\\', "a\nb"],
        ),
        (Opt.GRAMMAR, 'root ::= "x" ("1" | "22")', ["x1", "x22"]),
        (Opt.GRAMMAR, 'start: "q" | "r" "s"', ["q", "rs"]),  # Lark
    ],
)
def test_finite_language_first_mask_is_exact(xgr_backend, so_tokenizer, kind, spec, language):
    grammar = xgr_backend.compile_grammar(kind, spec)
    assert allowed_ids(grammar) == expected_first_tokens(so_tokenizer, language)


@pytest.mark.parametrize(
    "kind,spec,text",
    [
        (Opt.REGEX, "a[0-9]+z", "a12z"),
        (Opt.CHOICE, json.dumps(["yes", 'say "hi"\\']), 'say "hi"\\'),
        (Opt.GRAMMAR, 'root ::= "a" ("b" | "c")* "d"', "abcbd"),
        (Opt.JSON_OBJECT, "", '{"a": [1, 2.5, "x"], "b": {"c": null}}'),
    ],
)
def test_drive_to_termination(xgr_backend, so_tokenizer, kind, spec, text):
    grammar = xgr_backend.compile_grammar(kind, spec)
    drive(grammar, so_tokenizer, text)
    finish(grammar)
    assert grammar.num_processed_tokens == len(so_tokenizer.encode(text)) + 1


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.mark.parametrize(
    "spec", [json.dumps(SCHEMA), StructuredOutputsParams(json=SCHEMA).json_str]
)
def test_json_schema_object_completes(xgr_backend, so_tokenizer, spec):
    grammar = xgr_backend.compile_grammar(Opt.JSON, spec)
    first = {so_tokenizer.decode([t]) for t in allowed_ids(grammar)}
    assert "{" in first and "a" not in first and "[" not in first
    drive(grammar, so_tokenizer, '{"name": "bob", "age": 42}')
    finish(grammar)


def test_json_schema_rejects_a_wrong_type_and_an_extra_key(xgr_backend, so_tokenizer):
    grammar = xgr_backend.compile_grammar(Opt.JSON, json.dumps(SCHEMA))
    good = so_tokenizer.encode('{"name": ', add_special_tokens=False)
    bad = so_tokenizer.encode('{"name": 5', add_special_tokens=False)
    assert bad[: len(good)] == good
    assert grammar.validate_tokens(bad) == good  # stops at the 5; state unchanged
    assert grammar.num_processed_tokens == 0
    assert allowed_ids(grammar) == allowed_ids(
        xgr_backend.compile_grammar(Opt.JSON, json.dumps(SCHEMA))
    )
    extra = so_tokenizer.encode('{"name": "b", "age": 1, "x"', add_special_tokens=False)
    assert len(grammar.validate_tokens(extra)) < len(extra)


def test_whitespace_options(xgr_backend, so_tokenizer):
    space = so_tokenizer.convert_tokens_to_ids("Ġ")  # byte-level " "
    open_brace = so_tokenizer.convert_tokens_to_ids("{")
    loose = xgr_backend.compile_grammar(Opt.JSON, json.dumps(SCHEMA))
    tight = xgr_backend.compile_grammar(
        Opt.JSON,
        json.dumps(SCHEMA),
        params=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
    )
    for g in (loose, tight):
        assert g.accept_tokens("r", [open_brace])
    assert space in allowed_ids(loose) and space not in allowed_ids(tight)
    with pytest.raises(ValueError, match="whitespace_pattern"):
        xgr_backend.compile_grammar(
            Opt.JSON, "{}", params=StructuredOutputsParams(json={}, whitespace_pattern=r"[ ]?")
        )


def test_config_disable_any_whitespace(so_tokenizer):
    config = VllmConfig()
    config.structured_outputs_config.disable_any_whitespace = True
    backend = XgrammarBackend(config, tokenizer=so_tokenizer, vocab_size=PADDED_VOCAB)
    grammar = backend.compile_grammar(Opt.JSON, json.dumps(SCHEMA))
    grammar.accept_tokens("r", [so_tokenizer.convert_tokens_to_ids("{")])
    assert so_tokenizer.convert_tokens_to_ids("Ġ") not in allowed_ids(grammar)


def test_tokenizer_must_be_hugging_face():
    """xgrammar reads a Hugging Face tokenizer's vocabulary: another
    TokenizerLike is refused by name, not passed on to fail inside xgrammar."""

    class NotHF:
        eos_token_id = 0

    with pytest.raises(TypeError, match="NotHF"):
        XgrammarBackend(VllmConfig(), tokenizer=NotHF(), vocab_size=PADDED_VOCAB)


def test_structural_tag_compiles(xgr_backend, so_tokenizer):
    spec = json.dumps(
        {"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]}
    )
    grammar = xgr_backend.compile_grammar(Opt.STRUCTURAL_TAG, spec)
    assert so_tokenizer.convert_tokens_to_ids("a") in allowed_ids(grammar)  # free text
    drive(grammar, so_tokenizer, 'hi <f>{"name": "x", "age": 1}</f>')
    with pytest.raises(ValueError, match="structural_tag"):
        xgr_backend.compile_grammar(Opt.STRUCTURAL_TAG, "{not json")


def test_padding_ids_are_never_allowed(xgr_backend):
    grammar = xgr_backend.compile_grammar(Opt.JSON_OBJECT, "")
    assert allowed_ids(grammar)  # something is allowed
    assert max(allowed_ids(grammar)) < TINY_VOCAB


def test_rollback_and_reset(xgr_backend, so_tokenizer):
    grammar = xgr_backend.compile_grammar(Opt.REGEX, "abc|abd")
    start = allowed_ids(grammar)
    a, b = so_tokenizer.convert_tokens_to_ids("a"), so_tokenizer.convert_tokens_to_ids("b")
    assert grammar.accept_tokens("r", [a, b])
    after_ab = allowed_ids(grammar)
    assert after_ab != start
    grammar.rollback(1)
    assert grammar.num_processed_tokens == 1
    assert grammar.accept_tokens("r", [b]) and allowed_ids(grammar) == after_ab
    assert not grammar.accept_tokens("r", [a])  # rejected, state kept
    assert allowed_ids(grammar) == after_ab
    grammar.reset()
    assert grammar.num_processed_tokens == 0 and allowed_ids(grammar) == start


def test_after_termination_only_eos_is_accepted(xgr_backend, so_tokenizer):
    grammar = xgr_backend.compile_grammar(Opt.REGEX, "a")
    assert grammar.accept_tokens("r", [so_tokenizer.convert_tokens_to_ids("a"), EOS])
    assert grammar.is_terminated()
    assert grammar.accept_tokens("r", [EOS, EOS])  # ignore_eos keeps producing EOS
    assert not grammar.accept_tokens("r", [so_tokenizer.convert_tokens_to_ids("a")])
    assert grammar.validate_tokens([EOS]) == []


@pytest.mark.parametrize(
    "kind,spec,message",
    [
        (Opt.REGEX, "foo**", "repetition"),
        (Opt.REGEX, "[a-", "Unclosed"),
        (Opt.JSON, '{"type": "intege"}', "intege"),
        (Opt.JSON, "{bad", "JSON"),
        (Opt.GRAMMAR, "root ::= foo", "not defined"),
    ],
)
def test_compile_errors_are_value_errors(xgr_backend, kind, spec, message):
    with pytest.raises(ValueError, match=message) as info:
        xgr_backend.compile_grammar(kind, spec)
    assert ".cc:" not in str(info.value)  # no C++ source location in the message


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(regex="foo**"), "structured_outputs.regex.*repetition"),
        (dict(json="{bad"), "not JSON"),
        (dict(json={"type": "intege"}), "structured_outputs.json"),
        (dict(grammar="root ::= foo"), "structured_outputs.grammar"),
        (dict(grammar="start: missing_rule"), "structured_outputs.grammar"),
        (dict(json=SCHEMA, whitespace_pattern=" *"), "whitespace_pattern"),
        (dict(structural_tag="{x"), "structural_tag"),
    ],
)
def test_validate_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        validate_xgrammar_grammar(
            SamplingParams(structured_outputs=StructuredOutputsParams(**kwargs))
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(regex="(a+)+b"),  # ReDoS for backtracking engines; an automaton here
        dict(json=SCHEMA),
        dict(json=json.dumps(SCHEMA)),
        dict(json_object=True),
        dict(choice=['a"b', "c\\d"]),
        dict(grammar='root ::= "a"'),
        dict(grammar='start: "a"'),
    ],
)
def test_validate_accepts(kwargs, xgr_backend, so_tokenizer):
    validate_xgrammar_grammar(SamplingParams(structured_outputs=StructuredOutputsParams(**kwargs)))
    validate_xgrammar_grammar(SamplingParams())  # no constraint: nothing to check


def test_redos_regex_matches_in_linear_steps(xgr_backend, so_tokenizer):
    grammar = xgr_backend.compile_grammar(Opt.REGEX, "(a+)+b")
    drive(grammar, so_tokenizer, "a" * 40 + "b")
    finish(grammar)


def test_compiled_grammar_cache_stays_bounded(so_tokenizer):
    limit = 256 * 1024
    backend = XgrammarBackend(
        VllmConfig(), tokenizer=so_tokenizer, vocab_size=PADDED_VOCAB, cache_limit_bytes=limit
    )
    sizes = []
    for i in range(300):
        schema = {
            "type": "object",
            "properties": {f"key_{i}": {"type": "string"}, "n": {"type": "integer"}},
            "required": [f"key_{i}"],
        }
        backend.compile_grammar(Opt.JSON, json.dumps(schema))
        sizes.append(backend.cache_size_bytes())
    # Unbounded, the cache would hold every entry: far beyond the limit.
    assert sizes[0] * 300 > 4 * limit
    assert max(sizes) <= limit
    backend.destroy()
    assert backend.cache_size_bytes() == 0


def test_json_object_is_an_object_not_any_json(xgr_backend, so_tokenizer):
    """json_object means an object (upstream and OpenAI's mode), so a
    top-level array or scalar is refused from the first token."""
    grammar = xgr_backend.compile_grammar(Opt.JSON_OBJECT, "")
    texts = token_texts(so_tokenizer)
    first = {texts[i] for i in allowed_ids(grammar) if i in texts}
    assert "{" in first
    assert not first & {"[", '"', "1", "t"}
    drive(grammar, so_tokenizer, '{"a": [1, 2]}')
    finish(grammar)
