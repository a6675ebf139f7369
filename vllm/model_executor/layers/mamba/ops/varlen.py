"""How a step's flattened tokens are laid out for the batched state-space ops.

A step holds requests of different lengths, each with one state slot. The
ops want dense tensors, so requests are split into two groups, each padded
to its own longest request:

* decodes: requests with one token; a [G, 1] group that the single-step
  (decode) ops take without any padding;
* prefills: requests with more tokens, padded to [G, Lmax]. Padding sits
  after each request's last token, so causal ops never let it leak into real
  outputs, and the ops are given zero step sizes there (dt = 0, beta = 0,
  g = 0), which leaves the carried state unchanged through the padding.

Requests with no tokens this step are in neither group (their state is left).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StateGroup:
    token_index: torch.Tensor  # [G, L] long: flat token of each (request, position), clamped
    mask: torch.Tensor  # [G, L] bool: the position holds a real token
    lengths: torch.Tensor  # [G] long: real tokens per request
    flat_index: torch.Tensor  # [n] long: token_index[mask], in flat order
    slots: torch.Tensor | None  # [G] long: state slot per request; None: stateless
    has_initial_state: torch.Tensor | None  # [G] bool: the slot holds earlier tokens' state

    @property
    def max_len(self) -> int:
        return self.token_index.shape[1]

    def gather_states(self, states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """This group's states from `states` [slots, ...], zeros where the
        request starts from scratch -> [G, ...] in `dtype`."""
        assert self.slots is not None and self.has_initial_state is not None
        out = states.index_select(0, self.slots).to(dtype)
        keep = self.has_initial_state.view(-1, *([1] * (out.dim() - 1)))
        return torch.where(keep, out, torch.zeros((), dtype=dtype, device=out.device))

    def scatter_states(self, states: torch.Tensor, new: torch.Tensor) -> None:
        assert self.slots is not None
        states.index_copy_(0, self.slots, new.to(states.dtype))


def _group(
    starts: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None,
    has_init: torch.Tensor | None,
    max_len: int,
) -> StateGroup:
    pos = torch.arange(max_len, device=starts.device)
    mask = pos[None, :] < lengths[:, None]
    # Padding points at the request's last token, so gathers stay in range.
    token_index = starts[:, None] + torch.minimum(pos[None, :], lengths[:, None] - 1)
    return StateGroup(
        token_index=token_index,
        mask=mask,
        lengths=lengths,
        flat_index=token_index[mask],
        slots=slots,
        has_initial_state=has_init,
    )


def build_state_groups(
    query_start_loc: list[int],
    device: torch.device,
    state_indices: list[int] | None = None,
    has_initial_states: list[bool] | None = None,
) -> list[StateGroup]:
    """Group requests into (decodes, prefills), each present only if non-empty.
    `query_start_loc` [R + 1] host ints; without `state_indices` the groups
    are stateless (a dummy run)."""
    num_reqs = len(query_start_loc) - 1
    if state_indices is not None and len(state_indices) != num_reqs:
        raise ValueError(f"{len(state_indices)} state slots for {num_reqs} requests.")
    lens = [query_start_loc[i + 1] - query_start_loc[i] for i in range(num_reqs)]
    if any(n < 0 for n in lens):
        raise ValueError(f"query_start_loc must not decrease: {query_start_loc}.")
    groups = []
    for members in (
        [i for i, n in enumerate(lens) if n == 1],
        [i for i, n in enumerate(lens) if n > 1],
    ):
        if not members:
            continue

        def pick(values: list, members: list[int] = members) -> list:
            return [values[i] for i in members]

        def longs(values: list[int], members: list[int] = members) -> torch.Tensor:
            return torch.tensor(pick(values, members), device=device, dtype=torch.long)

        slots = init = None
        if state_indices is not None:
            slots = longs(state_indices)
            init = torch.tensor(
                pick(has_initial_states or [False] * num_reqs), dtype=torch.bool, device=device
            )
        groups.append(
            _group(
                longs(query_start_loc[:-1]),
                longs(lens),
                slots,
                init,
                max(pick(lens)),
            )
        )
    return groups
