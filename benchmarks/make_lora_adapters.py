"""Four peft LoRA adapters for the peer benchmark model (benchmark_lora.py).

    .venv/bin/python benchmarks/make_lora_adapters.py [--base DIR] [--out DIR]

Base: ~/.cache/vllm-peer/models/qwen2-rand-120m-fp32 (/work/shared/peer/
make_model.py; the bf16 model holds the same numbers). Each adapter: rank 16,
lora_alpha 16, every attention and MLP projection (q/k/v/o/gate/up/down),
init_lora_weights=False (random A and B, so outputs change), seed = index.
Written to <out>/a0 .. a3 (default ~/.cache/vllm-peer/models/qwen2-rand-120m-lora).
Needs peft (this project's test extra); idempotent.
"""

from __future__ import annotations

import argparse
import os

PEER_MODELS = os.path.expanduser("~/.cache/vllm-peer/models")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NUM_ADAPTERS, RANK = 4, 16


def make(base: str, out: str) -> list[str]:
    """Writes the missing adapters; returns the four adapter dirs."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    dirs = [os.path.join(out, f"a{i}") for i in range(NUM_ADAPTERS)]
    for seed, path in enumerate(dirs):
        if os.path.exists(os.path.join(path, "adapter_config.json")):
            continue
        model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = LoraConfig(
            r=RANK,
            lora_alpha=RANK,
            target_modules=TARGETS,
            init_lora_weights=False,
            lora_dropout=0.0,
        )
        torch.manual_seed(seed)
        get_peft_model(model, config).save_pretrained(path, safe_serialization=True)
        print(f"wrote {path}", flush=True)
    return dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.path.join(PEER_MODELS, "qwen2-rand-120m-fp32"))
    parser.add_argument("--out", default=os.path.join(PEER_MODELS, "qwen2-rand-120m-lora"))
    args = parser.parse_args()
    print("\n".join(make(args.base, args.out)))


if __name__ == "__main__":
    main()
