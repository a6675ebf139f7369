"""Offline embedding throughput: `LLM.embed` (runner="pooling", a decoder
converted with --convert embed, last-token pooling, V1 runner) against
transformers' batched forward on the same model and the same token ids.

It uses only the public API, so upstream's interpreter runs it too (the ratio
to quote is from one run: the machine is shared):

    python benchmarks/benchmark_pooling.py MODEL_DIR [--num-prompts 64] [--input-len 128]
    ~/.cache/vllm-peer/upstream-venv/bin/python benchmarks/benchmark_pooling.py MODEL_DIR

Prints prompt tokens per second (best of --iters) and the cosine of the first
embedding against transformers' normalised last hidden state.
"""

from __future__ import annotations

import argparse
import time

import torch


def _vllm_tok_s(args: argparse.Namespace, ids: list[list[int]]) -> tuple[float, torch.Tensor]:
    from vllm import LLM

    llm = LLM(
        args.model,
        runner="pooling",
        convert="embed",
        dtype=args.dtype,
        max_model_len=max(512, args.input_len),
        kv_cache_memory_bytes=1 << 28,
        max_num_batched_tokens=2048,
        max_num_seqs=args.num_prompts,
    )
    prompts = [{"prompt_token_ids": x} for x in ids]
    llm.embed(prompts[:4], use_tqdm=False)  # warm-up
    best = float("inf")
    for _ in range(args.iters):
        start = time.perf_counter()
        out = llm.embed(prompts, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    first = torch.tensor(out[0].outputs.embedding)
    del llm
    return len(ids) * args.input_len / best, first


def _hf_tok_s(args: argparse.Namespace, ids: list[list[int]]) -> tuple[float, torch.Tensor]:
    import transformers as tf

    dtype = getattr(torch, args.dtype)
    model = tf.AutoModel.from_pretrained(args.model, dtype=dtype).eval()
    x = torch.tensor(ids)
    best = float("inf")
    with torch.inference_mode():
        model(x[:4])
        for _ in range(args.iters):
            start = time.perf_counter()
            for i in range(0, len(ids), args.hf_batch_size):
                model(x[i : i + args.hf_batch_size])
            best = min(best, time.perf_counter() - start)
        ref = model(x[:1]).last_hidden_state[0, -1].float()
    return len(ids) * args.input_len / best, torch.nn.functional.normalize(ref, dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    ids = [
        torch.randint(100, 20000, (args.input_len,), generator=gen).tolist()
        for _ in range(args.num_prompts)
    ]
    ours, first = _vllm_tok_s(args, ids)
    print(f"vllm: {ours:.0f} prompt tok/s ({args.num_prompts} x {args.input_len})", flush=True)
    hf, ref = _hf_tok_s(args, ids)
    print(f"transformers (batch {args.hf_batch_size}): {hf:.0f} prompt tok/s", flush=True)
    cos = torch.nn.functional.cosine_similarity(first, ref, dim=0).item()
    print(f"ratio vllm / transformers: {ours / hf:.2f}; cosine of the first embedding: {cos:.6f}")


if __name__ == "__main__":
    main()
