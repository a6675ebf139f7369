"""Token embeddings and the LM head (upstream:
vllm/model_executor/layers/vocab_parallel_embedding.py).

The vocabulary is padded to a multiple of `padding_size` (64) so that it splits
evenly across tensor-parallel ranks; padded rows are zero and the logits
processor drops their columns. Rank r holds rows [r * per_rank, (r + 1) *
per_rank) of the padded table: the embedding looks up the ids in its range and
the ranks' partial lookups are summed; the LM head's partial logits are
gathered along the vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter

from vllm.distributed import divide, tensor_model_parallel_all_reduce
from vllm.model_executor.layers.linear import tp_size_and_rank
from vllm.model_executor.layers.utils import pack_weight_for_cpu
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils import round_up

DEFAULT_VOCAB_PADDING_SIZE = 64


class VocabParallelEmbedding(nn.Module):
    """Embedding table [num_embeddings_padded, embedding_dim]; rows past
    `org_vocab_size` are padding."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype: torch.dtype | None = None,
        org_num_embeddings: int | None = None,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.tp_size, self.tp_rank = tp_size_and_rank()
        self.num_embeddings = num_embeddings
        self.org_vocab_size = org_num_embeddings or num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_size = padding_size
        self.num_embeddings_padded = round_up(num_embeddings, padding_size)
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, self.tp_size)
        # [vocab_start_index, vocab_end_index): this rank's rows of the padded vocabulary.
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.params_dtype = params_dtype or torch.get_default_dtype()
        # A quantized table (GGUF) belongs to its method, which registers it;
        # a method without `embedding` (a linear-only config) leaves it dense.
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        self.quant_method: Any = method if hasattr(method, "embedding") else None
        if self.quant_method is not None:
            self.quant_method.create_weights(
                self,
                embedding_dim,
                [self.num_embeddings_per_partition],
                embedding_dim,
                self.num_embeddings_padded,
                self.params_dtype,
                weight_loader=self.weight_loader,
            )
            return
        self.weight = Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim, dtype=self.params_dtype),
            requires_grad=False,
        )
        set_weight_attrs(self.weight, {"weight_loader": self.weight_loader, "output_dim": 0})

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's rows of the checkpoint's [vocab, dim] table; zero
        the padding rows."""
        if loaded_weight.dim() != 2 or loaded_weight.shape[1] != param.shape[1]:
            raise ValueError(
                f"Embedding shape mismatch: checkpoint {tuple(loaded_weight.shape)}"
                f" vs parameter {tuple(param.shape)}."
            )
        n = loaded_weight.shape[0]
        if n > self.num_embeddings_padded:
            raise ValueError(
                f"Checkpoint vocab {n} exceeds the embedding size {self.num_embeddings_padded}."
            )
        _copy_rows(param, loaded_weight, self.vocab_start_index)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> embeddings [T, embedding_dim]."""
        if self.tp_size == 1:
            return self._lookup(input_ids)
        # Ids outside this rank's rows look up row 0 and are zeroed; the sum
        # over ranks then holds each token's one real row.
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill_(outside, 0)
        embeddings = self._lookup(local_ids)
        embeddings.masked_fill_(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(embeddings)

    def _lookup(self, local_ids: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.embedding(self, local_ids)
        return F.embedding(local_ids, self.weight)

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """A quantized table is decoded into its kernel's form once loaded."""
        if self.quant_method is not None:
            self.quant_method.process_weights_after_loading(self)

    def extra_repr(self) -> str:
        return (
            f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
            f"num_embeddings_padded={self.num_embeddings_padded}, tp_size={self.tp_size}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, stored like an embedding table. It is not called
    directly: `LogitsProcessor` multiplies hidden states by its weight."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        org_num_embeddings: int | None = None,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            params_dtype,
            org_num_embeddings,
            padding_size,
            quant_config,
            prefix,
        )
        self.tied = False
        self._packed_weight: torch.Tensor | None = None  # set after loading on CPU
        if bias:
            self.bias = Parameter(
                torch.zeros(self.num_embeddings_per_partition, dtype=self.params_dtype),
                requires_grad=False,
            )
            set_weight_attrs(self.bias, {"weight_loader": self._bias_loader})
        else:
            self.register_parameter("bias", None)

    def _bias_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        _copy_rows(param, loaded_weight, self.vocab_start_index)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> VocabParallelEmbedding:
        """Share the input embedding table (tie_word_embeddings=True). A
        quantized table (GGUF) is shared by becoming the embedding module: its
        method computes the logits from it (upstream does the same)."""
        if embed_tokens.quant_method is not None:
            return embed_tokens
        self.weight = embed_tokens.weight
        self.tied = True
        return self

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """On CPU, pack the real-vocabulary rows for the logits GEMM. A tied
        head keeps the dense table (the embedding reads it) and packs a copy.
        A quantized head is decoded by its method."""
        if self.quant_method is not None:
            return super().process_weights_after_loading(act_dtype)
        # With TP every rank packs its whole shard: the gathered logits are
        # trimmed to the real vocabulary afterwards.
        rows = self.org_vocab_size if self.tp_size == 1 else self.num_embeddings_per_partition
        packed = pack_weight_for_cpu(self.weight[:rows])
        if packed is None:
            return
        self._packed_weight = packed
        if not self.tied:
            self.weight = Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("LMHead's weights should be used in the sampler.")


def _copy_rows(param: Parameter, loaded_weight: torch.Tensor, start: int) -> None:
    """param[i] = loaded_weight[start + i] where that row exists, else zero."""
    rows = max(0, min(param.shape[0], loaded_weight.shape[0] - start))
    param.data[:rows].copy_(loaded_weight[start : start + rows])
    param.data[rows:].zero_()
