"""Write peft LoRA adapters for a tiny random Llama (the tests' references)."""

from __future__ import annotations

import torch

# Every attention and MLP projection of a Llama decoder layer.
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_peft_adapter(
    base_dir: str,
    out_dir: str,
    *,
    r: int,
    lora_alpha: int,
    use_rslora: bool = False,
    seed: int = 0,
    safe_serialization: bool = True,
    **lora_kwargs,
):
    """Save a peft adapter with random (not zero) A and B for `base_dir`'s
    model to `out_dir`; returns the in-memory PeftModel."""
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    base = tf.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        use_rslora=use_rslora,
        target_modules=lora_kwargs.pop("target_modules", LLAMA_TARGETS),
        init_lora_weights=False,  # random B too, so the adapter changes outputs
        lora_dropout=0.0,
        **lora_kwargs,
    )
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    model.save_pretrained(out_dir, safe_serialization=safe_serialization)
    return model
