"""Tiny random EAGLE-1 and EAGLE-3 heads in the layouts the public checkpoints
use (no hub: built here for a target from tests/utils.py make_tiny_model).

EAGLE-1 (yuhuili/EAGLE-LLaMA3-Instruct-8B's layout): config.json is a plain
LlamaConfig with architectures ["LlamaForCausalLM"] and num_hidden_layers 1
(vLLM renames it to EagleLlamaForCausalLM); tensors fc.weight [H, 2H] and
layers.0.* without layers.0.input_layernorm; embed_tokens.weight and
lm_head.weight only when asked (else the target's are shared).

EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's layout): architectures
["LlamaForCausalLMEagle3"], draft_vocab_size, optional
eagle_aux_hidden_state_layer_ids; tensors fc.weight [H, A*H], midlayer.*
(hidden_norm, input_layernorm, post_attention_layernorm, self_attn q/k/v
[*, 2H], o_proj, mlp), norm.weight, lm_head.weight [draft_vocab, H], d2t
(int64 offsets, target id = i + d2t[i]) and t2d (bool mask over the target
vocabulary), embed_tokens.weight only when asked.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf


def _target_config(target_dir: str) -> dict:
    with open(os.path.join(target_dir, "config.json")) as f:
        return json.load(f)


def _head_config(target: dict, architectures: list[str], **extra) -> dict:
    """A one-layer Llama config with the target's widths and vocabulary."""
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
    config = {k: target[k] for k in keys if k in target}
    head_dim = target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"]
    rope = target.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0}
    config.update(
        architectures=architectures,
        model_type="llama",
        num_hidden_layers=1,
        head_dim=head_dim,
        hidden_act="silu",
        rope_parameters=rope,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    config.update(extra)
    return config


def _rand(gen: torch.Generator, *shape: int, scale: float = 0.05) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _norm(gen: torch.Generator, size: int) -> torch.Tensor:
    # All-ones norms would hide a missing or misplaced norm: perturb them.
    return 1.0 + _rand(gen, size, scale=0.1)


def _layer_tensors(
    gen: torch.Generator, config: dict, prefix: str, qkv_in: int
) -> dict[str, torch.Tensor]:
    h, inter = config["hidden_size"], config["intermediate_size"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    return {
        f"{prefix}.self_attn.q_proj.weight": _rand(gen, q, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": _rand(gen, kv, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": _rand(gen, kv, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": _rand(gen, h, q),
        f"{prefix}.mlp.gate_proj.weight": _rand(gen, inter, h),
        f"{prefix}.mlp.up_proj.weight": _rand(gen, inter, h),
        f"{prefix}.mlp.down_proj.weight": _rand(gen, h, inter),
        f"{prefix}.post_attention_layernorm.weight": _norm(gen, h),
    }


def _save(out_dir: str, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "model.safetensors")
    )
    return out_dir


def make_tiny_eagle(
    target_dir: str,
    out_dir: str,
    seed: int = 0,
    with_embed_tokens: bool = False,
    with_lm_head: bool = False,
) -> str:
    """A random EAGLE-1 head for the target at `target_dir`; returns out_dir."""
    config = _head_config(_target_config(target_dir), ["LlamaForCausalLM"])
    gen = torch.Generator().manual_seed(seed)
    h, vocab = config["hidden_size"], config["vocab_size"]
    tensors = {"fc.weight": _rand(gen, h, 2 * h, scale=0.1)}
    tensors.update(_layer_tensors(gen, config, "layers.0", h))
    if with_embed_tokens:
        tensors["embed_tokens.weight"] = _rand(gen, vocab, h, scale=0.5)
    if with_lm_head:
        tensors["lm_head.weight"] = _rand(gen, vocab, h, scale=0.5)
    return _save(out_dir, config, tensors)


def draft_vocab_map(vocab: int, draft_vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [draft_vocab] int64, t2d [vocab] bool) for a random sorted subset
    of the target vocabulary, as EAGLE-3's training scripts store them."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    d2t = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return d2t.to(torch.int64), t2d


def make_tiny_eagle3(
    target_dir: str,
    out_dir: str,
    seed: int = 0,
    draft_vocab_size: int | None = None,
    aux_layer_ids: list[int] | None = None,
    with_embed_tokens: bool = False,
    use_aux_hidden_state: bool = True,
    **config_overrides,
) -> str:
    """A random EAGLE-3 head for the target at `target_dir`; a smaller
    `draft_vocab_size` writes d2t/t2d; `aux_layer_ids` goes to the config as
    eagle_aux_hidden_state_layer_ids; use_aux_hidden_state=False writes
    eagle_config {"use_aux_hidden_state": false} and no fc (the head reads the
    target's last hidden states). Returns out_dir."""
    target = _target_config(target_dir)
    extra: dict = {"draft_vocab_size": draft_vocab_size or target["vocab_size"]}
    if aux_layer_ids is not None:
        extra["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    if not use_aux_hidden_state:
        extra["eagle_config"] = {"use_aux_hidden_state": False}
    config = _head_config(target, ["LlamaForCausalLMEagle3"], **extra, **config_overrides)
    gen = torch.Generator().manual_seed(seed)
    h, vocab = config["hidden_size"], config["vocab_size"]
    n_aux = len(aux_layer_ids) if aux_layer_ids else 3
    tensors = {
        "fc.weight": _rand(gen, h, n_aux * h, scale=0.1),
        "midlayer.hidden_norm.weight": _norm(gen, h),
        "midlayer.input_layernorm.weight": _norm(gen, h),
        "norm.weight": _norm(gen, h),
        "lm_head.weight": _rand(gen, config["draft_vocab_size"], h, scale=0.5),
    }
    tensors.update(_layer_tensors(gen, config, "midlayer", 2 * h))
    if not use_aux_hidden_state:
        del tensors["fc.weight"]
    if config["draft_vocab_size"] != vocab:
        tensors["d2t"], tensors["t2d"] = draft_vocab_map(vocab, config["draft_vocab_size"], seed)
    if with_embed_tokens:
        tensors["embed_tokens.weight"] = _rand(gen, vocab, h, scale=0.5)
    return _save(out_dir, config, tensors)


def _causal(t: int) -> torch.Tensor:
    return torch.full((t, t), float("-inf")).triu(1)[None, None]


class RefHead:
    """EAGLE's training-code structure on transformers' modules."""

    def __init__(self, head_dir: str, eagle3: bool):
        self.w = load_file(f"{head_dir}/model.safetensors")
        cfg = LlamaConfig.from_pretrained(head_dir)
        cfg._attn_implementation = "eager"
        self.cfg, self.eagle3 = cfg, eagle3
        p = "midlayer" if eagle3 else "layers.0"
        self.attn = hf.LlamaAttention(cfg, layer_idx=0)
        if eagle3:  # q/k/v read cat(embeds, hidden)
            for n in ("q_proj", "k_proj", "v_proj"):
                old = getattr(self.attn, n)
                setattr(
                    self.attn, n, torch.nn.Linear(2 * cfg.hidden_size, old.out_features, bias=False)
                )
        self.mlp = hf.LlamaMLP(cfg)
        self.post_ln = hf.LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        for mod, sub in (
            (self.attn, "self_attn"),
            (self.mlp, "mlp"),
            (self.post_ln, "post_attention_layernorm"),
        ):
            mod.load_state_dict(
                {
                    k[len(f"{p}.{sub}.") :]: v
                    for k, v in self.w.items()
                    if k.startswith(f"{p}.{sub}.")
                }
            )
        self.rope = hf.LlamaRotaryEmbedding(cfg)

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        n = hf.LlamaRMSNorm(x.shape[-1], eps=self.cfg.rms_norm_eps)
        n.weight.data.copy_(self.w[name])
        return n(x)

    @torch.no_grad()
    def __call__(self, ids, hidden, embed_w, lm_w):
        """Whole-sequence forward: (logits over the full vocabulary, carry)."""
        t = len(ids)
        e = F.embedding(torch.tensor(ids), embed_w)[None]
        pe = self.rope(e, torch.arange(t)[None])
        if self.eagle3:
            normed = self._norm("midlayer.hidden_norm.weight", hidden[None])
            x = torch.cat([self._norm("midlayer.input_layernorm.weight", e), normed], -1)
            residual = hidden[None]
        else:
            x = F.linear(torch.cat([e, hidden[None]], -1), self.w["fc.weight"])
            residual = x  # layer 0 has no input norm
        r = self.attn(x, position_embeddings=pe, attention_mask=_causal(t))[0] + residual
        out = self.mlp(self.post_ln(r)) + r
        if self.eagle3:
            logits = F.linear(self._norm("norm.weight", out), self.w["lm_head.weight"])[0]
            full = torch.full((t, self.cfg.vocab_size), float("-inf"))
            d2t = self.w.get("d2t", torch.zeros(logits.shape[1], dtype=torch.int64))
            ids_t = torch.arange(logits.shape[1]) + d2t
            full[:, ids_t] = logits
            return full, out[0]
        return F.linear(out, lm_w)[0], out[0]


class RefDrafter:
    """EAGLE drafting recomputed from scratch on transformers' modules: the
    target's states over the whole known sequence (its final hidden states,
    or for EAGLE-3 its residual stream at `aux_ids`), pass 1 over positions
    0..N-2 feeding token p+1 with the target's state at p, then each draft
    with the head's own output at the previous position. Returns the drafts
    and, per draft, the margin between the best and second-best logit (a
    near-tie may flip under float error)."""

    def __init__(self, target_dir: str, head_dir: str, method: str, aux_ids=None):
        from transformers import AutoModelForCausalLM

        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        tw = load_file(f"{target_dir}/model.safetensors")
        self.head = RefHead(head_dir, eagle3=method == "eagle3")
        hw = self.head.w
        self.embed_w = hw.get("embed_tokens.weight", tw["model.embed_tokens.weight"])
        self.lm_w = hw.get("lm_head.weight", tw["lm_head.weight"])
        self.method, self.aux_ids = method, aux_ids

    @torch.no_grad()
    def _target_states(self, tokens: list[int]) -> torch.Tensor:
        """[N, H]: what the head reads at each position (EAGLE-3: fc applied)."""
        layers = self.target.model.layers
        outs: list[torch.Tensor] = []
        hooks = [layer.register_forward_hook(lambda m, a, o: outs.append(o)) for layer in layers]
        try:
            res = self.target(torch.tensor([tokens]), output_hidden_states=True)
        finally:
            for h in hooks:
                h.remove()
        if self.method == "eagle" or "fc.weight" not in self.head.w:
            return res.hidden_states[-1][0]
        streams = [res.hidden_states[0][0]] + [o[0] if o.dim() == 3 else o for o in outs]
        cat = torch.cat([streams[d] for d in self.aux_ids], dim=-1)
        return F.linear(cat, self.head.w["fc.weight"])

    @torch.no_grad()
    def drafts(self, tokens: list[int], k: int) -> tuple[list[int], list[float]]:
        hidden = self._target_states(tokens)[:-1]  # positions 0..N-2
        inputs = list(tokens[1:])
        out: list[int] = []
        margins: list[float] = []
        for _ in range(k):
            logits, carry = self.head(inputs, hidden, self.embed_w, self.lm_w)
            top = logits[-1].topk(2)
            out.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            inputs.append(out[-1])
            hidden = torch.cat([hidden, carry[-1:]], dim=0)
        return out, margins


def make_bigram_target(out_dir: str, seed: int = 0) -> str:
    """A one-layer tiny Llama whose attention output is zero and whose final
    norm weight is one: its next token depends only on the current token."""
    from tests.utils import make_tiny_model

    make_tiny_model("llama", out_dir, seed=seed, num_hidden_layers=1)
    path = os.path.join(out_dir, "model.safetensors")
    w = load_file(path)
    w["model.layers.0.self_attn.o_proj.weight"].zero_()
    w["model.norm.weight"].fill_(1.0)
    save_file(w, path, metadata={"format": "pt"})
    return out_dir


def make_oracle_eagle(target_dir: str, out_dir: str, seed: int = 0) -> str:
    """An EAGLE-1 head that predicts a `make_bigram_target` model exactly: fc
    passes the token's embedding through ([I | 0]), attention adds nothing
    (o_proj zero) and the MLP block is the target's, so its output is the
    target's pre-norm state for that token; the final RMSNorm (weight one) only
    scales it, so the shared LM head's argmax is the target's next token."""
    config = _head_config(_target_config(target_dir), ["LlamaForCausalLM"])
    gen = torch.Generator().manual_seed(seed)
    h = config["hidden_size"]
    tensors = _layer_tensors(gen, config, "layers.0", h)
    tensors["layers.0.self_attn.o_proj.weight"].zero_()
    target = load_file(os.path.join(target_dir, "model.safetensors"))
    for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm"):
        tensors[f"layers.0.{name}.weight"] = target[f"model.layers.0.{name}.weight"].clone()
    tensors["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    return _save(out_dir, config, tensors)
