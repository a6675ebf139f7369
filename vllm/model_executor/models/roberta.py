"""RoBERTa and XLM-RoBERTa, encoder-only (upstream:
vllm/model_executor/models/roberta.py).

The body is BERT's (`BertModel`) with `RobertaEmbedding`. What differs:

- Positions. transformers' `create_position_ids_from_input_ids` numbers the
  non-padding tokens from `padding_idx + 1` (the padding token itself gets
  `padding_idx`). Requests here are never padded, so request token i has
  position `padding_idx + 1 + i`: the runner's 0-based positions are shifted
  by `padding_idx + 1` (the position table has `max_position_embeddings =
  max_len + padding_idx + 1` rows, e.g. 514 for a 512-token model).
- The classifier head (`RobertaClassificationHead`): CLS -> dense -> tanh ->
  out_proj, with no pooler layer in the body.

XLM-R ("XLMRobertaModel", "XLMRobertaForSequenceClassification") has the same
layout and uses these classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler import DispatchPooler
from vllm.model_executor.layers.pooler.seqwise import CLSPool
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.bert import (
    BertEmbeddingModel,
    BertModel,
    _decode_token_type_ids,
    _encode_token_type_ids,
    num_labels_of,
    strip_checkpoint_prefix,
)
from vllm.model_executor.models.utils import lookup_param, maybe_prefix


class RobertaEmbedding(nn.Module):
    """word + position (already shifted by padding_idx + 1) + token type
    embeddings, then LayerNorm."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        position_type = getattr(config, "position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"RoBERTa position_embedding_type={position_type!r} is not supported "
                "(only 'absolute' is)."
            )
        self.size = config.hidden_size
        self.padding_idx = config.pad_token_id
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = VocabParallelEmbedding(
            config.max_position_embeddings, config.hidden_size
        )
        self.token_type_embeddings = VocabParallelEmbedding(
            config.type_vocab_size, config.hidden_size
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        token_type_ids = _decode_token_type_ids(input_ids)
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = (
            inputs_embeds
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(position_ids)
        )
        return self.LayerNorm(embeddings)


def replace_roberta_positions(positions: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """The runner's 0-based positions of unpadded requests -> RoBERTa's
    (transformers numbers real tokens from padding_idx + 1)."""
    return positions + (padding_idx + 1)


class RobertaClassificationHead(nn.Module):
    """transformers' head over the CLS row: out_proj(tanh(dense(x)))."""

    def __init__(self, config: PretrainedConfig, head_dtype: torch.dtype) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, dtype=head_dtype)
        self.out_proj = nn.Linear(config.hidden_size, num_labels_of(config), dtype=head_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(x)))


class RobertaEmbeddingModel(BertEmbeddingModel):
    """RoBERTa / XLM-R as an embedder (CLS by default; a sentence-transformers
    directory's pooling and normalisation are read by the config)."""

    _body_prefixes = ("model.", "roberta.")
    _skipped_heads = ("pooler.", "lm_head.")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        assert vllm_config.model_config is not None
        self.padding_idx: int = vllm_config.model_config.hf_config.pad_token_id

    def _build_model(self, vllm_config: VllmConfig, prefix: str = "") -> BertModel:
        return BertModel(vllm_config=vllm_config, prefix=prefix, embedding_class=RobertaEmbedding)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        positions = replace_roberta_positions(positions, self.padding_idx)
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)


class RobertaForSequenceClassification(nn.Module):
    """A RoBERTa / XLM-R cross-encoder or classifier: the CLS row through
    `RobertaClassificationHead`."""

    is_pooling_model = True
    default_pooling_type = "CLS"
    attn_type = "encoder_only"
    supports_cross_encoding = True
    packed_modules_mapping = BertModel.packed_modules_mapping

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        model_config = vllm_config.model_config
        assert model_config is not None and model_config.pooler_config is not None
        config = model_config.hf_config
        self.padding_idx: int = config.pad_token_id
        self.num_labels = config.num_labels
        self.roberta = BertModel(
            vllm_config=vllm_config,
            prefix=maybe_prefix(prefix, "roberta"),
            embedding_class=RobertaEmbedding,
        )
        self.classifier = RobertaClassificationHead(config, model_config.head_dtype)
        self.pooler = DispatchPooler.for_seq_cls(
            model_config.pooler_config, pooling=CLSPool(), classifier=self.classifier
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.roberta.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if token_type_ids is not None:
            _encode_token_type_ids(input_ids, token_type_ids)
        positions = replace_roberta_positions(positions, self.padding_idx)
        return self.roberta(input_ids, positions, intermediate_tensors, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = set()
        body: list[tuple[str, torch.Tensor]] = []
        head = dict(self.classifier.named_parameters())
        for name, weight in weights:
            if name.startswith("classifier."):
                param = lookup_param(head, name.removeprefix("classifier."), name)
                default_weight_loader(param, weight)
                loaded.add(name)
            else:
                body.append((name, weight))
        stripped = strip_checkpoint_prefix(body, ("roberta.",), ("pooler.", "lm_head."))
        return loaded | {f"roberta.{n}" for n in self.roberta.load_weights(stripped)}
