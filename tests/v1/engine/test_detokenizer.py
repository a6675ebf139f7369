"""Incremental detokenization and stop strings (upstream: tests/detokenizer/)."""

from __future__ import annotations

import pytest

from tests.v1.engine.conftest import make_request
from vllm.v1.engine.detokenizer import (
    FastIncrementalDetokenizer,
    IncrementalDetokenizer,
    SlowIncrementalDetokenizer,
    check_stop_strings,
)

UNICODE_TEXT = "héllo 日本語 🎉 done, naïve café"
PANGRAM = "The quick brown fox jumps over the lazy dog."


def _detok(kind: str, tokenizer, prompt_ids: list[int], **params) -> IncrementalDetokenizer:
    request = make_request(prompt_ids, **params)
    if kind == "fast":
        return FastIncrementalDetokenizer(tokenizer, request)
    return SlowIncrementalDetokenizer(tokenizer, request)


@pytest.mark.parametrize("kind", ["fast", "slow"])
@pytest.mark.parametrize("tok_name", ["tiny_tokenizer", "gguf_tokenizer"])
def test_split_utf8_never_yields_replacement_char(request, kind, tok_name):
    tokenizer = request.getfixturevalue(tok_name)
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    ids = tokenizer.encode(UNICODE_TEXT, add_special_tokens=False)
    # The premise: some character really is split over several tokens.
    assert any("\ufffd" in tokenizer.decode(ids[:i]) for i in range(1, len(ids)))
    detok = _detok(kind, tokenizer, prompt)
    deltas = []
    for token_id in ids:
        assert detok.update([token_id], stop_terminated=False) is None
        delta = detok.get_next_output_text(finished=False, delta=True)
        assert "\ufffd" not in delta
        deltas.append(delta)
    deltas.append(detok.get_next_output_text(finished=True, delta=True))
    assert "".join(deltas) == detok.output_text == UNICODE_TEXT
    assert detok.output_token_ids == ids


def test_fast_detokenizer_is_picked_for_fast_tokenizers(tiny_tokenizer):
    detok = IncrementalDetokenizer.from_new_request(tiny_tokenizer, make_request([1, 2]))
    assert isinstance(detok, FastIncrementalDetokenizer)
    assert (
        type(IncrementalDetokenizer.from_new_request(None, make_request([1])))
        is IncrementalDetokenizer
    )


@pytest.mark.parametrize("kind", ["fast", "slow"])
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundary(tiny_tokenizer, kind, include):
    ids = tiny_tokenizer.encode(PANGRAM)
    stop = "own fox ju"  # starts inside " brown", ends inside " jumps"
    detok = _detok(kind, tiny_tokenizer, [1], stop=[stop], include_stop_str_in_output=include)
    matched_at = None
    for i, token_id in enumerate(ids):
        result = detok.update([token_id], stop_terminated=False)
        if result is not None:
            matched_at = i
            assert result == stop
            break
    # The match comes exactly with the token that completes it (" jumps").
    assert matched_at == 4
    expected = "The quick brown fox ju" if include else "The quick br"
    assert detok.output_text == expected
    assert detok.get_next_output_text(finished=True, delta=False) == expected


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_in_a_multi_token_step_trims_later_tokens(tiny_tokenizer, include):
    ids = tiny_tokenizer.encode(PANGRAM)
    detok = _detok("fast", tiny_tokenizer, [1], stop=["fox"], include_stop_str_in_output=include)
    assert detok.update(ids, stop_terminated=False) == "fox"
    # Tokens after " fox" (the 4th) are dropped, as if generated one at a time.
    assert detok.output_token_ids == ids[:4]
    assert detok.output_text == ("The quick brown fox" if include else "The quick brown ")


def test_earliest_completing_stop_string_wins(tiny_tokenizer):
    ids = tiny_tokenizer.encode(PANGRAM)
    detok = _detok("fast", tiny_tokenizer, [1], stop=["lazy", "quick"])
    assert detok.update(ids, stop_terminated=False) == "quick"
    assert detok.output_text == "The "


def test_delta_text_holds_back_a_possible_stop_prefix(tiny_tokenizer):
    ids = tiny_tokenizer.encode(PANGRAM)
    detok = _detok("fast", tiny_tokenizer, [1], stop=["dogs!"])  # never completes
    deltas = []
    for token_id in ids:
        assert detok.update([token_id], stop_terminated=False) is None
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
        # Up to len("dogs!") - 1 characters stay unsent while running.
        assert len(detok.output_text) - len("".join(deltas)) == min(4, len(detok.output_text))
    deltas.append(detok.get_next_output_text(finished=True, delta=True))
    assert "".join(deltas) == PANGRAM


def test_min_tokens_ignores_stop_strings_before_it(tiny_tokenizer):
    ids = tiny_tokenizer.encode("The quick fox. The quick fox.")
    detok = _detok("fast", tiny_tokenizer, [1], stop=["fox"], min_tokens=4)
    fox_positions = [i for i, t in enumerate(ids) if tiny_tokenizer.decode([t]) == " fox"]
    assert len(fox_positions) == 2 and fox_positions[0] < 4 <= fox_positions[1]
    stopped_at = next(
        i for i, t in enumerate(ids) if detok.update([t], stop_terminated=False) == "fox"
    )
    # The first " fox" comes before min_tokens tokens: only the second one stops.
    assert stopped_at == fox_positions[1]
    assert detok.output_text == "The quick fox. The quick "


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_text_excluded_unless_asked(tiny_tokenizer, include):
    ids = tiny_tokenizer.encode("The quick brown")
    detok = _detok("fast", tiny_tokenizer, [1], include_stop_str_in_output=include)
    detok.update(ids[:-1], stop_terminated=False)
    detok.update(ids[-1:], stop_terminated=True)  # " brown" was a stop token id
    assert detok.output_token_ids == ids
    assert detok.output_text == ("The quick brown" if include else "The quick")


def test_check_stop_strings_contract():
    # Only matches that end inside the new characters count.
    assert check_stop_strings("abcdef", 2, ["bc"], False) is None
    assert check_stop_strings("abcdef", 2, ["de"], False) == ("de", 3)
    assert check_stop_strings("abcdef", 2, ["de"], True) == ("de", 5)
    assert check_stop_strings("abcdef", 2, ["ef"], True) == ("ef", -1)
    assert check_stop_strings("abcdef", 0, ["ef"], True) is None
    assert check_stop_strings("abcdef", 3, [], True) is None
