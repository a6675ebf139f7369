"""Streamed text through the whole engine, in both model runners: DELTA
pieces joined == the FINAL_ONLY text == decode(all output ids), for a prompt
and an output whose multi-byte characters are split over byte tokens; no
U+FFFD ever appears, not even in a partial output.

The model is the tiny Llama rewired to emit a fixed cycle of tokens: the
attention and MLP outputs are zeroed, so the last hidden state is the
current token's embedding, a one-hot vector e_i for the i-th token of the
cycle, and the LM head maps e_i to a large logit for token i + 1.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch

from vllm import LLM, SamplingParams
from vllm.sampling_params import RequestOutputKind

CYCLE_TEXT = "日é Ж🎉!"  # every character but " " and "!" is several byte tokens


@pytest.fixture(scope="module")
def cycle_model(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_model_dir("llama")
    tokenizer = AutoTokenizer.from_pretrained(src)
    cycle = tokenizer.encode(CYCLE_TEXT)
    assert len(set(cycle)) == len(cycle) and tokenizer.decode(cycle * 2) == CYCLE_TEXT * 2
    assert len(cycle) > len(CYCLE_TEXT)  # really split over byte tokens
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(
                ("o_proj.weight", "down_proj.weight", "embed_tokens.weight", "lm_head.weight")
            ):
                p.zero_()
            elif name == "model.norm.weight":
                p.fill_(1.0)
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        for i, token in enumerate(cycle):
            emb[token, i] = 1.0
            head[cycle[(i + 1) % len(cycle)], i] = 10.0
    out = tmp_path_factory.mktemp("cycle-llama")
    model.save_pretrained(out, safe_serialization=True)
    for f in glob.glob(os.path.join(src, "*token*")):
        shutil.copy(f, out)
    return str(out), cycle


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_streamed_text_is_whole_characters(cycle_model, runner, monkeypatch):
    model_dir, cycle = cycle_model
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    llm = LLM(
        model=model_dir, dtype="float32", max_model_len=64, kv_cache_memory_bytes=8 * 2**20, seed=0
    )
    tokenizer = llm.get_tokenizer()
    prompt_ids = tokenizer.encode("Prompt ñ: ") + cycle
    max_tokens = 3 * len(cycle)
    engine = llm.llm_engine
    texts: dict[RequestOutputKind, list[str]] = {kind: [] for kind in RequestOutputKind}
    token_ids: dict[RequestOutputKind, list[int]] = {kind: [] for kind in RequestOutputKind}
    for kind in RequestOutputKind:
        engine.add_request(
            kind.name,
            {"prompt_token_ids": prompt_ids},
            SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind
            ),
        )
    prompts = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            kind = RequestOutputKind[out.request_id]
            texts[kind].append(out.outputs[0].text)
            token_ids[kind] = (
                token_ids[kind] + out.outputs[0].token_ids
                if kind == RequestOutputKind.DELTA
                else out.outputs[0].token_ids
            )
            prompts.add(out.prompt_token_ids and tuple(out.prompt_token_ids))
    ids = token_ids[RequestOutputKind.FINAL_ONLY]
    assert ids == cycle * 3  # the model really runs the cycle
    expected = tokenizer.decode(ids)
    assert expected == CYCLE_TEXT * 3
    assert all("\ufffd" not in t for kind in texts for t in texts[kind])
    assert texts[RequestOutputKind.FINAL_ONLY] == [expected]
    assert "".join(texts[RequestOutputKind.DELTA]) == expected
    assert len(texts[RequestOutputKind.DELTA]) == max_tokens
    # Some deltas are empty: a character was still incomplete.
    assert "" in texts[RequestOutputKind.DELTA]
    cumulative = texts[RequestOutputKind.CUMULATIVE]
    assert cumulative[-1] == expected and all(expected.startswith(t) for t in cumulative)
    assert all(token_ids[k] == ids for k in RequestOutputKind)
    assert prompts == {tuple(prompt_ids)}
