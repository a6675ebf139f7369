"""RoBERTa and XLM-RoBERTa, encoder-only (upstream:
vllm/model_executor/models/roberta.py).

The body is BERT's (`BertModel`) with `RobertaEmbedding`. What differs:

- Positions. transformers' `create_position_ids_from_input_ids` numbers the
  non-padding tokens from `padding_idx + 1` (the padding token itself gets
  `padding_idx`). Requests here are never padded, so request token i has
  position `padding_idx + 1 + i`: `RobertaEmbedding` reads the position table
  at the runner's 0-based position + (padding_idx + 1), as upstream's
  `replace_roberta_positions` does (the table has `max_position_embeddings =
  max_len + padding_idx + 1` rows, e.g. 514 for a 512-token model).
- The classifier head (`RobertaClassificationHead`): CLS -> dense -> tanh ->
  out_proj, with no pooler layer in the body.

XLM-R ("XLMRobertaModel", "XLMRobertaForSequenceClassification") has the same
layout and uses these classes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler.seqwise import CLSPool, SequencePoolingMethod
from vllm.model_executor.models.bert import (
    BertEmbedding,
    BertEmbeddingModel,
    BertForSequenceClassification,
    BertModel,
    num_labels_of,
)


class RobertaEmbedding(BertEmbedding):
    """BERT's embeddings with positions shifted by padding_idx + 1."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config, position_offset=config.pad_token_id + 1)
        self.padding_idx: int = config.pad_token_id


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

    embedding_class = RobertaEmbedding
    _body_prefixes = ("model.", "roberta.")
    _skipped_heads = ("pooler.", "lm_head.")


class RobertaForSequenceClassification(BertForSequenceClassification):
    """A RoBERTa / XLM-R cross-encoder or classifier: the CLS row through
    `RobertaClassificationHead` (the body has no pooler layer)."""

    body_name = "roberta"
    embedding_class = RobertaEmbedding

    def _build_body(self, vllm_config: VllmConfig, prefix: str) -> BertModel:
        return BertModel(
            vllm_config=vllm_config, prefix=prefix, embedding_class=self.embedding_class
        )

    def _build_head(self, config: PretrainedConfig, head_dtype: torch.dtype) -> nn.Module:
        return RobertaClassificationHead(config, head_dtype)

    def _pooling(self) -> SequencePoolingMethod:
        return CLSPool()
