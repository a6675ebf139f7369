"""BERT, encoder-only (upstream: vllm/model_executor/models/bert.py).

`BertModel` is the body: word + absolute position + token-type embeddings and
a LayerNorm, then post-LN encoder layers (bidirectional self-attention with no
KV cache, `EncoderOnlyAttention`; a GELU MLP). The pooling wrappers are
`BertEmbeddingModel` (the "BertModel" architecture: BGE, E5, ...) and
`BertForSequenceClassification` (CLS -> dense + tanh -> classifier:
cross-encoder rerankers).

Token type ids. Pairs (a cross-encoder's query and document) need segment ids
0 / 1. They travel inside `input_ids`, as upstream does: token ids are below
2**30, so `_encode_token_type_ids` ORs the segment id into bit 30 of each
token (int32, the sign bit stays clear) and `BertEmbedding` splits the two
again (`_decode_token_type_ids`). The runner hands `token_type_ids` to the
`*ForSequenceClassification` forward, which encodes; without them every
token is segment 0, as transformers assumes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from vllm.attention.layers.encoder_only_attention import EncoderOnlyAttention
from vllm.config import CacheConfig, VllmConfig
from vllm.config.pooler import PoolerConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import get_act_fn
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.pooler import DispatchPooler, Pooler
from vllm.model_executor.layers.pooler.seqwise import CLSPool, SequencePoolingMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.utils import is_onednn_packed
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.utils import load_stacked_weight, lookup_param, maybe_prefix
from vllm.v1.pool.metadata import PoolingMetadata

# Bit 30 of an int32 input id carries the token's segment (0 or 1).
TOKEN_TYPE_SHIFT = 30

# (fused parameter, checkpoint name part, shard id)
_STACKED_PARAMS: list[tuple[str, str, str | int]] = [
    (".qkv_proj.", ".query.", "q"),
    (".qkv_proj.", ".key.", "k"),
    (".qkv_proj.", ".value.", "v"),
]


def _encode_token_type_ids(input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> None:
    """input_ids[i] |= token_type_ids[i] << 30, in place (input_ids may be
    longer: padding after the real tokens keeps segment 0)."""
    n = token_type_ids.shape[0]
    input_ids[:n].bitwise_or_(token_type_ids.to(input_ids.dtype) << TOKEN_TYPE_SHIFT)


def _decode_token_type_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Split what `_encode_token_type_ids` packed: returns the segment ids and
    clears bit 30 of `input_ids` in place, leaving the token ids."""
    type_bit = 1 << TOKEN_TYPE_SHIFT
    token_type_ids = input_ids.bitwise_and(type_bit) >> TOKEN_TYPE_SHIFT
    input_ids.bitwise_and_(~type_bit)
    return token_type_ids


def num_labels_of(config: PretrainedConfig) -> int:
    """The classifier's output size, from the checkpoint's config."""
    if config.num_labels is None:
        raise ValueError("The sequence-classification checkpoint's config has no num_labels.")
    return config.num_labels


class BertEmbedding(nn.Module):
    """word + absolute position + token type embeddings, then LayerNorm.

    The position table is read at the runner's 0-based position plus
    `position_offset`: 0 for BERT; RoBERTa's subclass passes its own."""

    def __init__(self, config: PretrainedConfig, position_offset: int = 0) -> None:
        super().__init__()
        position_type = getattr(config, "position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"{type(self).__name__}: position_embedding_type={position_type!r} is not "
                "supported (only 'absolute' is)."
            )
        self.size = config.hidden_size
        self.position_offset = position_offset
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
        if self.position_offset:
            position_ids = position_ids + self.position_offset
        embeddings = (
            inputs_embeds
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(position_ids)
        )
        return self.LayerNorm(embeddings)


def _cpu_packed_weight(linear: nn.Module) -> torch.Tensor | None:
    """The oneDNN-packed weight of an unquantized CPU linear layer that adds
    its own bias and needs no collective (tensor_parallel_size 1), else None.
    Such a layer can run with a fused post-op (`_linear_pointwise`: GELU on
    the float32 accumulator, or + a residual tensor) instead of a separate
    elementwise pass over its output."""
    packed = getattr(linear, "_packed_weight", None)
    if (
        not isinstance(packed, torch.Tensor)
        or not is_onednn_packed(packed)  # panels (float32 on AVX2) have no post-ops
        or not isinstance(getattr(linear, "quant_method", None), UnquantizedLinearMethod)
        or getattr(linear, "skip_bias_add", True)
        or get_tensor_model_parallel_world_size() != 1
    ):
        return None
    return packed


class BertSelfAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        cache_config: CacheConfig | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        if num_attention_heads % tp_size != 0:
            raise ValueError(
                f"BERT's {num_attention_heads} attention heads do not split over "
                f"tensor_parallel_size={tp_size}."
            )
        self.head_dim = hidden_size // num_attention_heads
        if self.head_dim * num_attention_heads != hidden_size:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of the head count.")
        self.num_heads = num_attention_heads // tp_size
        self.q_size = self.num_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size,
            self.head_dim,
            num_attention_heads,
            num_attention_heads,
            bias=True,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.attn = EncoderOnlyAttention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            cache_config=cache_config,
            num_kv_heads=self.num_heads,
            quant_config=quant_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.q_size, self.q_size], dim=-1)
        return self.attn(q, k, v)


class BertSelfOutput(nn.Module):
    """dense [in_features -> hidden], then LayerNorm over (its output + the
    block's input). After attention in_features is hidden_size; `BertOutput`
    (after the MLP) is the same with in_features = intermediate_size."""

    def __init__(
        self,
        hidden_size: int,
        layer_norm_eps: float,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        in_features: int | None = None,
    ) -> None:
        super().__init__()
        self.dense = RowParallelLinear(
            in_features or hidden_size,
            hidden_size,
            bias=True,
            quant_config=quant_config,
            prefix=f"{prefix}.dense",
        )
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        packed = _cpu_packed_weight(self.dense)
        if packed is not None and hidden_states.dim() == 2 and input_tensor.is_contiguous():
            # One oneDNN call: dense + bias + residual, summed before rounding.
            summed = torch.ops.mkldnn._linear_pointwise.binary(
                hidden_states, input_tensor, packed, self.dense.bias, "add"
            )
            return self.LayerNorm(summed)
        hidden_states, _ = self.dense(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class BertAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        layer_norm_eps: float,
        cache_config: CacheConfig | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.self = BertSelfAttention(
            hidden_size, num_attention_heads, cache_config, quant_config, prefix=f"{prefix}.self"
        )
        self.output = BertSelfOutput(
            hidden_size, layer_norm_eps, quant_config, prefix=f"{prefix}.output"
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden_states), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(
            hidden_size, intermediate_size, bias=True, quant_config=quant_config,
            prefix=f"{prefix}.dense",
        )  # fmt: skip
        self.intermediate_act_fn = get_act_fn(hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        act = self.intermediate_act_fn
        packed = _cpu_packed_weight(self.dense)
        if packed is not None and isinstance(act, nn.GELU):
            # GELU as oneDNN's post-op: applied to the float32 accumulator in
            # the GEMM's own pass (algorithm "none" = erf, "tanh" = tanh form).
            return torch.ops.mkldnn._linear_pointwise(
                hidden_states, packed, self.dense.bias, "gelu", [], act.approximate
            )
        hidden_states, _ = self.dense(hidden_states)
        return act(hidden_states)


class BertOutput(BertSelfOutput):
    """The MLP's down projection [intermediate -> hidden] + residual LayerNorm."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        layer_norm_eps: float,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            hidden_size, layer_norm_eps, quant_config, prefix, in_features=intermediate_size
        )


class BertLayer(nn.Module):
    """Post-LN block: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(
        self,
        config: PretrainedConfig,
        cache_config: CacheConfig | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        hidden, inter, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.attention = BertAttention(
            hidden, config.num_attention_heads, eps, cache_config, quant_config,
            prefix=f"{prefix}.attention",
        )  # fmt: skip
        self.intermediate = BertIntermediate(
            hidden, inter, config.hidden_act, quant_config, prefix=f"{prefix}.intermediate"
        )
        self.output = BertOutput(hidden, inter, eps, quant_config, prefix=f"{prefix}.output")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        attn_output = self.attention(hidden_states)
        return self.output(self.intermediate(attn_output), attn_output)


class BertEncoder(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        config = vllm_config.model_config.hf_config
        self.layer = nn.ModuleList(
            BertLayer(
                config,
                vllm_config.cache_config,
                vllm_config.quant_config,
                prefix=f"{prefix}.layer.{i}",
            )
            for i in range(config.num_hidden_layers)
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return hidden_states


class BertModel(nn.Module):
    """The encoder body: (input_ids [T], positions [T]) -> hidden states [T, H]."""

    is_pooling_model = True
    packed_modules_mapping = {"qkv_proj": ["query", "key", "value"]}

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        embedding_class: type[nn.Module] = BertEmbedding,
    ) -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise NotImplementedError("Pipeline parallelism is not built for BERT-style models.")
        self.config = vllm_config.model_config.hf_config
        self.embeddings = embedding_class(self.config)
        self.encoder = BertEncoder(vllm_config=vllm_config, prefix=f"{prefix}.encoder")

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        word_embeddings = self.embeddings.word_embeddings
        assert isinstance(word_embeddings, nn.Module)
        return word_embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if intermediate_tensors is not None:
            raise NotImplementedError("Pipeline parallelism is not built for BERT-style models.")
        hidden_states = self.embeddings(
            input_ids=input_ids, position_ids=positions, inputs_embeds=inputs_embeds
        )
        return self.encoder(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names relative to the body (`embeddings.*`, `encoder.*`;
        `pooler.*` only when this body has a pooler, else skipped); q/k/v
        go into their shards of `qkv_proj`."""
        params = dict(self.named_parameters())
        has_pooler = any(name.startswith("pooler.") for name in params)
        loaded: set[str] = set()
        for name, weight in weights:
            if name.endswith("position_ids") or (name.startswith("pooler.") and not has_pooler):
                continue  # HF's position buffer; the unused pooler of an embedder
            target = load_stacked_weight(self, params, name, weight, _STACKED_PARAMS)
            if target is not None:
                loaded.add(target)
        return loaded


class BertPooler(SequencePoolingMethod):
    """HF's BertPooler as a pooling method: each request's CLS hidden state,
    then tanh(dense(.)) (the "pooled output" a BERT classifier reads)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.pooling = CLSPool()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> list[torch.Tensor | None]:
        rows = self.pooling(hidden_states, pooling_metadata)
        ready = [i for i, row in enumerate(rows) if row is not None]
        if not ready:
            return rows
        pooled = self.activation(self.dense(torch.stack([rows[i] for i in ready])))
        out: list[torch.Tensor | None] = [None] * len(rows)
        for j, i in enumerate(ready):
            out[i] = pooled[j]
        return out


class BertPoolingModel(BertModel):
    """The body plus HF's pooler layer (`pooler.dense`), for classifiers."""

    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        embedding_class: type[nn.Module] = BertEmbedding,
    ) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, embedding_class=embedding_class)
        self.pooler = BertPooler(self.config)


def strip_checkpoint_prefix(
    weights: Iterable[tuple[str, torch.Tensor]], prefixes: tuple[str, ...], skip: tuple[str, ...]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names relative to the body: the first of `prefixes` a name
    starts with is removed; names starting with one of `skip` (heads this
    model does not have) are dropped."""
    for name, weight in weights:
        for p in prefixes:
            if name.startswith(p):
                name = name[len(p) :]
                break
        if not name.startswith(skip):
            yield name, weight


class _EncoderPoolingModel(nn.Module):
    """What the BERT-family pooling models share: the contract the engine
    reads, and the body they delegate to (`self.<body_name>`, which is also
    the checkpoint prefix of its weights)."""

    is_pooling_model = True
    default_pooling_type = "CLS"
    attn_type = "encoder_only"
    packed_modules_mapping = BertModel.packed_modules_mapping
    body_name: ClassVar[str] = "model"
    # The body's embeddings (RoBERTa's subclasses: RobertaEmbedding).
    embedding_class: ClassVar[type[nn.Module]] = BertEmbedding

    def _body(self) -> BertModel:
        body = getattr(self, self.body_name)
        assert isinstance(body, BertModel)
        return body

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._body().embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self._body()(input_ids, positions, intermediate_tensors, inputs_embeds)


class BertEmbeddingModel(_EncoderPoolingModel):
    """BERT as an embedder (the "BertModel" architecture): the body's hidden
    states pooled per `pooler_config` (CLS by default; a sentence-transformers
    directory's mean pooling and normalisation are read by the config)."""

    # Checkpoint name prefixes of the body, and heads an embedder does not use.
    _body_prefixes: tuple[str, ...] = ("model.", "bert.")
    _skipped_heads: tuple[str, ...] = ("pooler.", "cls.", "lm_head.")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        assert vllm_config.model_config is not None
        pooler_config = vllm_config.model_config.pooler_config
        assert pooler_config is not None, "pooling models need a resolved pooler_config"
        self.model = self._build_model(vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.pooler = self._build_pooler(pooler_config)

    def _build_model(self, vllm_config: VllmConfig, prefix: str = "") -> BertModel:
        return BertModel(
            vllm_config=vllm_config, prefix=prefix, embedding_class=self.embedding_class
        )

    def _build_pooler(self, pooler_config: PoolerConfig) -> Pooler:
        return DispatchPooler.for_embedding(pooler_config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        body = strip_checkpoint_prefix(weights, self._body_prefixes, self._skipped_heads)
        return {f"model.{name}" for name in self.model.load_weights(body)}


class BertForSequenceClassification(_EncoderPoolingModel):
    """A BERT cross-encoder / classifier: CLS -> tanh(dense) -> classifier
    [num_labels, hidden]. `classify` applies softmax (sigmoid for one label),
    `score` the cross-encoder activation; both through the pooler package.

    RoBERTa's classifier subclasses it with its own body (`roberta`) and
    head (`_build_head`); forward and weight loading are shared."""

    supports_cross_encoding = True
    body_name = "bert"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        model_config = vllm_config.model_config
        assert model_config is not None and model_config.pooler_config is not None
        self.num_labels = num_labels_of(model_config.hf_config)
        body_prefix = maybe_prefix(prefix, self.body_name)
        self.add_module(self.body_name, self._build_body(vllm_config, body_prefix))
        self.classifier = self._build_head(model_config.hf_config, model_config.head_dtype)
        self.pooler = DispatchPooler.for_seq_cls(
            model_config.pooler_config, pooling=self._pooling(), classifier=self.classifier
        )

    def _build_body(self, vllm_config: VllmConfig, prefix: str) -> BertModel:
        """With HF's pooler layer (`pooler.dense`), which the head reads."""
        return BertPoolingModel(
            vllm_config=vllm_config, prefix=prefix, embedding_class=self.embedding_class
        )

    def _build_head(self, config: PretrainedConfig, head_dtype: torch.dtype) -> nn.Module:
        return nn.Linear(config.hidden_size, self.num_labels, dtype=head_dtype)

    def _pooling(self) -> SequencePoolingMethod:
        """Which row the head reads: the body's BertPooler (CLS, dense, tanh)."""
        body = self._body()
        assert isinstance(body, BertPoolingModel)
        return body.pooler

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
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """`classifier.*` into the head; the rest, less the body prefix, into
        the body (an LM head a checkpoint may carry is dropped)."""
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
        stripped = strip_checkpoint_prefix(body, (f"{self.body_name}.",), ("lm_head.", "cls."))
        return loaded | {f"{self.body_name}.{n}" for n in self._body().load_weights(stripped)}
