"""A tiny random model whose tokenizer has `<think>` and `</think>` as single
tokens inside the model's vocabulary (two of the tokenizer's filler tokens
renamed), for the reasoning-aware structured-output tests."""

from __future__ import annotations

import json
import os

from tests.utils import make_tiny_model

MARKERS = {"<|fill_0|>": "<think>", "<|fill_1|>": "</think>"}


def make_think_model(kind: str, out_dir: str) -> str:
    make_tiny_model(kind, out_dir)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    for token in tokenizer["added_tokens"]:
        token["content"] = MARKERS.get(token["content"], token["content"])
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    for token in config.get("added_tokens_decoder", {}).values():
        token["content"] = MARKERS.get(token["content"], token["content"])
    with open(path, "w") as f:
        json.dump(config, f)
    return out_dir
