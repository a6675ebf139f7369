"""Speculative decoding metrics over a real `vllm serve` (n-gram drafts on a
tiny random Llama): the four upstream counters on /metrics with their labels,
consistent with each other, and the periodic acceptance log line."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer

NUM_SPEC = 3


def _repetitive(seed: int, n: int) -> list[int]:
    """A prompt repeating a short random phrase: prompt lookup finds drafts."""
    rng = random.Random(seed)
    phrase = [rng.randrange(1, 512) for _ in range(rng.randrange(4, 8))]
    return (phrase * (n // len(phrase) + 1))[:n]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[RemoteOpenAIServer]:
    spec = {"method": "ngram", "num_speculative_tokens": NUM_SPEC, "prompt_lookup_min": 2}
    log_path = str(tmp_path_factory.mktemp("spec-metrics") / "server.log")
    args = [
        *("--dtype", "float32", "--max-model-len", "256", "--enforce-eager"),
        *("--kv-cache-memory-bytes", str(16 * 2**20), "--max-num-seqs", "8"),
        *("--speculative-config", json.dumps(spec)),
    ]
    server = RemoteOpenAIServer(tiny_model_dir("llama"), args, log_path=log_path)
    server.log_path = log_path  # type: ignore[attr-defined]
    yield server
    server.stop()


def _samples(server: RemoteOpenAIServer) -> dict[tuple[str, str], float]:
    """(metric name, its `position` label or "") -> value, spec-decode metrics only."""
    text = httpx.get(server.url_for("metrics"), timeout=5).text
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode") or "_created" in line:
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        assert 'model_name="' in labels and 'engine="0"' in labels
        position = re.search(r'position="(\d+)"', labels)
        out[(name, position.group(1) if position else "")] = float(value)
    return out


def test_counters_and_log_line(server):
    before = _samples(server)
    # Every counter exists from the start (zero), one per-position series each.
    assert before[("vllm:spec_decode_num_drafts_total", "")] == 0
    assert {k for k in before if k[1]} == {
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i)) for i in range(NUM_SPEC)
    }
    client = server.get_client()
    for seed in range(3):
        client.completions.create(
            model=client.models.list().data[0].id,
            prompt=_repetitive(seed, 48),
            max_tokens=24,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
    after = _samples(server)
    num_drafts = after[("vllm:spec_decode_num_drafts_total", "")]
    num_draft_tokens = after[("vllm:spec_decode_num_draft_tokens_total", "")]
    num_accepted = after[("vllm:spec_decode_num_accepted_tokens_total", "")]
    per_pos = [
        after[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))]
        for i in range(NUM_SPEC)
    ]
    assert num_drafts > 0 and num_accepted > 0
    assert num_drafts <= num_draft_tokens <= NUM_SPEC * num_drafts
    assert sum(per_pos) == num_accepted <= num_draft_tokens
    # A draft token is accepted only after all those before it.
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] <= num_drafts

    # The periodic stats lines (every 10 s) carry the acceptance summary of
    # their interval: together, every draft.
    pattern = re.compile(
        r"SpecDecoding metrics: Mean acceptance length: [\d.]+, .*"
        r"Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
        r"Per-position acceptance rate: [\d., ]+, Avg Draft acceptance rate: [\d.]+%"
    )
    totals = (0, 0)
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and totals != (num_accepted, num_draft_tokens):
        time.sleep(1)
        with open(server.log_path) as f:  # type: ignore[attr-defined]
            lines = pattern.findall(f.read())
        totals = (sum(int(a) for a, _ in lines), sum(int(d) for _, d in lines))
    assert totals == (num_accepted, num_draft_tokens)
