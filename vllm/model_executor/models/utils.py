"""Helpers shared by model definitions (upstream: vllm/model_executor/models/utils.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import get_weight_loader

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from vllm.sequence import IntermediateTensors

WeightsIter = Iterable[tuple[str, torch.Tensor]]


def maybe_prefix(prefix: str, name: str) -> str:
    """`prefix.name`, or `name` when the prefix is empty."""
    return name if not prefix else f"{prefix}.{name}"


def extract_layer_index(layer_name: str) -> int:
    """The single integer component of a layer's dotted name
    ("model.layers.3.self_attn.attn" -> 3)."""
    indices = [int(part) for part in layer_name.split(".") if part.isdigit()]
    if len(indices) != 1:
        raise ValueError(f"layer name {layer_name!r} should contain exactly one index.")
    return indices[0]


class PPMissingLayer(torch.nn.Identity):
    """Stands in for a layer another pipeline stage holds: no parameters, and
    its weights are skipped at load time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The first argument, unchanged (as nn.Identity)."""
        return args[0] if args else next(iter(kwargs.values()))


def make_layers(
    num_hidden_layers: int, layer_fn: Callable[[str], nn.Module], prefix: str
) -> tuple[int, int, nn.ModuleList]:
    """(start_layer, end_layer, layers): layers [start, end) are this pipeline
    stage's and built; the others are PPMissingLayer placeholders, so layer i
    keeps its index (and its weight names) on every stage."""
    from vllm.distributed import get_pp_group, get_pp_indices

    pp_group = get_pp_group()
    start, end = get_pp_indices(num_hidden_layers, pp_group.rank_in_group, pp_group.world_size)
    layers = nn.ModuleList(
        [
            layer_fn(f"{prefix}.{i}") if start <= i < end else PPMissingLayer()
            for i in range(num_hidden_layers)
        ]
    )
    return start, end, layers


def is_pp_missing_parameter(name: str, model: nn.Module) -> bool:
    """Whether parameter `name` belongs to a PPMissingLayer of `model` (another
    pipeline stage holds it)."""
    parts = name.split(".")
    module: nn.Module = model
    for part in parts[:-1]:
        if isinstance(module, PPMissingLayer):
            return True
        child = module._modules.get(part)
        if child is None:
            return False
        module = child
    return isinstance(module, PPMissingLayer)


def make_empty_intermediate_tensors_factory(
    keys: list[str], hidden_size: int
) -> Callable[..., IntermediateTensors]:
    """A `make_empty_intermediate_tensors(batch_size, dtype, device)` for a
    model whose stages pass `keys`, each [batch_size, hidden_size]."""
    from vllm.sequence import IntermediateTensors

    def make_empty_intermediate_tensors(
        batch_size: int, dtype: torch.dtype, device: torch.device
    ) -> IntermediateTensors:
        return IntermediateTensors(
            {
                key: torch.zeros((batch_size, hidden_size), dtype=dtype, device=device)
                for key in keys
            }
        )

    return make_empty_intermediate_tensors


def norm_with_residual(
    norm: nn.Module, hidden_states: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's input norm over the residual stream -> (normed, residual).

    The first layer (`residual` None) starts the stream with its input; later
    layers let the norm fuse the residual add (`norm(x, residual)` returns
    the normed sum and the sum)."""
    if residual is None:
        return norm(hidden_states), hidden_states
    return norm(hidden_states, residual)


def single_stage_embeds(
    model: nn.Module,
    embed_tokens: nn.Module,
    input_ids: torch.Tensor | None,
    intermediate_tensors: object,
    inputs_embeds: torch.Tensor | None,
) -> torch.Tensor:
    """The input embeddings [T, hidden] of a body built without pipeline
    parallelism: `inputs_embeds` when given, else `embed_tokens(input_ids)`."""
    if intermediate_tensors is not None:
        raise NotImplementedError(f"Pipeline parallelism is not built for {type(model).__name__}.")
    return inputs_embeds if inputs_embeds is not None else embed_tokens(input_ids)


class AutoWeightsLoader:
    """Route checkpoint tensors to the submodules they belong to.

    Names are consumed one dotted component at a time: a child module that
    defines `load_weights` gets its whole group (with the prefix stripped);
    a parameter is loaded with its `weight_loader`. Any name that matches
    nothing and is not skipped is an error, so a checkpoint/model mismatch
    cannot pass silently.
    """

    # Buffers some checkpoints carry that are recomputed here.
    ROTARY_EMBEDS_UNUSED_WEIGHTS = [
        "rotary_emb.inv_freq",
        "rotary_emb.cos_cached",
        "rotary_emb.sin_cached",
    ]

    def __init__(
        self,
        module: nn.Module,
        *,
        skip_prefixes: list[str] | None = None,
        skip_substrs: list[str] | None = None,
    ) -> None:
        self.module = module
        self.skip_prefixes = skip_prefixes or []
        self.skip_substrs = (skip_substrs or []) + self.ROTARY_EMBEDS_UNUSED_WEIGHTS

    def _can_skip(self, qualname: str) -> bool:
        return any(qualname.startswith(p) for p in self.skip_prefixes) or any(
            s in qualname for s in self.skip_substrs
        )

    def _groupby_prefix(self, weights: WeightsIter) -> Iterator[tuple[str, WeightsIter]]:
        split = ((name.split(".", 1), w) for name, w in weights)
        for prefix, group in itertools.groupby(split, key=lambda x: x[0][0]):
            yield prefix, ((parts[1] if len(parts) > 1 else "", w) for parts, w in group)

    def _load_param(
        self, base_prefix: str, param: nn.Parameter, weights: WeightsIter
    ) -> Iterator[str]:
        for rest, weight in weights:
            if rest:  # e.g. "weight.extra": no such parameter
                raise ValueError(f"Unexpected weight name {base_prefix}.{rest}")
            loader = get_weight_loader(param)
            loader(param, weight)
            yield base_prefix

    def _load_module(
        self, base_prefix: str, module: nn.Module, weights: WeightsIter
    ) -> Iterator[str]:
        load_weights = getattr(module, "load_weights", None) if module is not self.module else None
        if load_weights is not None:
            loaded = load_weights(weights)
            yield from (maybe_prefix(base_prefix, name) for name in loaded)
            return
        children = dict(module.named_children())
        params = dict(module.named_parameters(recurse=False))
        for child_prefix, child_weights in self._groupby_prefix(weights):
            qualname = maybe_prefix(base_prefix, child_prefix)
            if isinstance(children.get(child_prefix), PPMissingLayer):
                for _ in child_weights:  # another pipeline stage loads these
                    pass
            elif child_prefix in children:
                yield from self._load_module(qualname, children[child_prefix], child_weights)
            elif child_prefix in params:
                yield from self._load_param(qualname, params[child_prefix], child_weights)
            else:
                for rest, _ in child_weights:
                    full = maybe_prefix(qualname, rest)
                    if not self._can_skip(full):
                        raise ValueError(
                            f"There is no module or parameter named {full!r} "
                            f"in {type(self.module).__name__}."
                        )

    def load_weights(self, weights: WeightsIter) -> set[str]:
        """Load everything not skipped; returns the names of the loaded parameters."""
        weights = ((n, w) for n, w in weights if not self._can_skip(n))
        return set(self._load_module("", self.module, weights))


def load_stacked_weights(
    module: nn.Module,
    weights: WeightsIter,
    stacked_params_mapping: list[tuple[str, str, str | int]],
    skip_substrs: Iterable[str] = (),
) -> set[str]:
    """Load a transformer body whose checkpoint splits fused parameters.

    `stacked_params_mapping` lists (fused_name, checkpoint_name, shard_id), e.g.
    (".qkv_proj", ".q_proj", "q"): a checkpoint tensor named with ".q_proj" goes
    into the "q" shard of the fused ".qkv_proj" parameter.
    """
    params = dict(module.named_parameters())
    skip = tuple(skip_substrs) + tuple(AutoWeightsLoader.ROTARY_EMBEDS_UNUSED_WEIGHTS)
    loaded: set[str] = set()
    for name, weight in weights:
        if any(s in name for s in skip):
            continue
        target = load_stacked_weight(module, params, name, weight, stacked_params_mapping)
        if target is not None:
            loaded.add(target)
    return loaded


def load_stacked_weight(
    module: nn.Module,
    params: dict[str, nn.Parameter],
    name: str,
    weight: torch.Tensor,
    stacked_params_mapping: list[tuple[str, str, str | int]],
) -> str | None:
    """Load one checkpoint tensor of `load_stacked_weights`: into its shard of
    a fused parameter, else into the parameter of the same name. Returns the
    parameter's name, or None when another pipeline stage holds it."""
    target, shard_id = name, None
    for fused, part, fused_shard_id in stacked_params_mapping:
        if part in name:
            target, shard_id = name.replace(part, fused), fused_shard_id
            break
    if is_pp_missing_parameter(target, module):
        return None
    param = lookup_param(params, target, name)
    if shard_id is None:
        get_weight_loader(param)(param, weight)
    else:
        get_weight_loader(param)(param, weight, shard_id)
    return target


def lookup_param(params: dict[str, nn.Parameter], target: str, ckpt_name: str) -> nn.Parameter:
    """`params[target]`, or a ValueError naming the checkpoint tensor."""
    if target not in params:
        raise ValueError(f"Checkpoint weight {ckpt_name!r} has no matching parameter ({target!r}).")
    return params[target]


class CausalLMBase(nn.Module):
    """A decoder body plus an LM head: the runner's model contract
    (`embed_input_ids`, `forward`, `compute_logits`, `load_weights`), whose
    methods only delegate. A subclass builds its body under `body_name` and
    calls `init_lm_head`; a method it needs done otherwise it overrides."""

    # The body's attribute; it is also the checkpoint prefix of its weights.
    body_name: ClassVar[str] = "model"

    def init_lm_head(
        self,
        config: PretrainedConfig,
        prefix: str,
        embed_tokens: nn.Module,
        tie: bool,
        hidden_size: int | None = None,
        scale: float = 1.0,
        soft_cap: float | None = None,
        quant_config: Any = None,
    ) -> None:
        """`lm_head` [vocab_size, hidden_size (default config.hidden_size)] on
        the last pipeline stage, sharing `embed_tokens`' table when `tie`; and
        the `logits_processor` (with its `scale` and `soft_cap`). `quant_config`
        may quantize the head (GGUF's output table)."""
        from vllm.distributed import get_pp_group

        # A tied quantized (GGUF) head is the embedding module itself.
        self.lm_head: ParallelLMHead | VocabParallelEmbedding | PPMissingLayer
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size,
                hidden_size or config.hidden_size,
                quant_config=quant_config,
                prefix=maybe_prefix(prefix, "lm_head"),
            )
            if tie:
                # The last stage keeps the embedding when the head is tied to it.
                assert isinstance(embed_tokens, VocabParallelEmbedding), type(embed_tokens)
                self.lm_head = self.lm_head.tie_weights(embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=scale, soft_cap=soft_cap)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.body_name).embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """-> hidden_states [T, hidden] (logits come from `compute_logits`), or
        the IntermediateTensors for the next pipeline stage."""
        body = getattr(self, self.body_name)
        return body(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [N, hidden] -> logits [N, vocab_size] in the model dtype."""
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: WeightsIter) -> set[str]:
        """A tied head has no weight of its own: a checkpoint copy is skipped."""
        skip = ["lm_head."] if getattr(self.lm_head, "tied", False) else None
        return AutoWeightsLoader(self, skip_prefixes=skip).load_weights(weights)
