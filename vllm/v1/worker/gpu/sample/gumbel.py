"""Gumbel-max sampling with a stateless random stream
(upstream: vllm/v1/worker/gpu/sample/gumbel.py).

Sampling token v with probability softmax(logits)[v] is the same as taking
argmax_v(logits[v] + G_v) with G_v i.i.d. standard Gumbel, G = -log(-log U)
for U uniform in (0, 1). No softmax, no cumulative sum, no host sync.

The uniforms come from a counter-based hash, not from a generator with state:

    key     = mix(seed, pos)                        one 32-bit key per row
    U[v]    = uniform(fmix32(v * 0x9E3779B9 + key))

where `seed` is the request's seed, `pos` the position of the token the
logits row was computed at, and fmix32 the murmur3 finaliser (a bijection on
32-bit words with full avalanche). So a seeded request draws the same noise at
the same position whatever else is in the batch, whichever row it sits in and
however the steps were chunked. Multiplying v by an odd constant and *adding*
the key makes the hash inputs of two rows with different keys the same set only
when the keys differ by a multiple that lands inside the vocabulary (odds
~2 * vocab / 2**32), so rows do not share noise.

uniform(h) = ((h >> 9) * 2 + 1) * 2**-24: the top 23 bits as an odd multiple of
2**-24, exact in float32 and never 0 or 1.

The torch path (CPU) and the Triton kernel (CUDA) compute the same bits: the
torch path keeps the words in int32 (multiplication wraps modulo 2**32; right
shifts are arithmetic, so the sign-extended bits are masked off), the kernel
in uint32. They can differ only through `log` rounding (an ulp).
"""
from __future__ import annotations

import numpy as np
import torch

from vllm.triton_utils import HAS_TRITON, tl, triton

_FMIX_C1 = 0x85EBCA6B
_FMIX_C2 = 0xC2B2AE35
_VOCAB_MUL = 0x9E3779B9  # odd: v -> v * c is a bijection modulo 2**32
_POS_SALT = 0x7F4A7C15
_UNIFORM_SCALE = 2.0 ** -24


def _as_int32(c: int) -> int:
    """The int32 with the same bits as the uint32 `c`."""
    return c - (1 << 32) if c >= 1 << 31 else c


def apply_temperature(logits: torch.Tensor, idx_mapping: torch.Tensor,
                      temperature: torch.Tensor) -> None:
    """logits[i] /= temperature[idx_mapping[i]], in place; rows at temperature 0
    (greedy) are left as they are."""
    temp = temperature[idx_mapping.to(torch.int64)]
    temp = torch.where(temp == 0.0, 1.0, temp)
    logits.div_(temp.unsqueeze(1))


def gumbel_sample(logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor,
                  seeds: torch.Tensor, pos: torch.Tensor,
                  is_greedy_np: np.ndarray | None = None) -> torch.Tensor:
    """[num_rows] int64: argmax of each row, plus Gumbel noise for rows whose
    temperature (temperature[idx_mapping[i]]) is not 0. Temperature must already
    be applied. temperature/seeds: [max_num_reqs] by request row; pos: [num_rows].
    `is_greedy_np` (host copy of temperature == 0 per row) lets the torch path
    skip the noise of greedy rows without a device sync.
    """
    if logits.is_cuda and HAS_TRITON:
        return _gumbel_sample_triton(logits, idx_mapping, temperature, seeds, pos)
    return _gumbel_sample_torch(logits, idx_mapping, temperature, seeds, pos, is_greedy_np)


# ---- torch path --------------------------------------------------------------------

class _Int32Hasher:
    """fmix32 over int32 tensors, in place, with one scratch buffer."""

    C1 = torch.tensor(_as_int32(_FMIX_C1), dtype=torch.int32)
    C2 = torch.tensor(_as_int32(_FMIX_C2), dtype=torch.int32)

    @staticmethod
    def _xorshift(h: torch.Tensor, shift: int, tmp: torch.Tensor) -> None:
        # h ^= h >>> shift (logical): arithmetic shift, then drop the sign bits.
        torch.bitwise_right_shift(h, shift, out=tmp)
        tmp.bitwise_and_((1 << (32 - shift)) - 1)
        h.bitwise_xor_(tmp)

    @classmethod
    def fmix32_(cls, h: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
        # The function-call forms (not `h >> s`, `h * c`) take torch's
        # vectorised kernels for int32 (measured ~10x faster on CPU).
        cls._xorshift(h, 16, tmp)
        h.mul_(cls.C1.to(h.device))
        cls._xorshift(h, 13, tmp)
        h.mul_(cls.C2.to(h.device))
        cls._xorshift(h, 16, tmp)
        return h


def row_keys(seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[num_rows] int32 keys: fmix32(fmix32(fmix32(pos ^ salt) ^ seed_lo) ^ seed_hi)."""
    seeds = seeds.to(torch.int64)
    seed_lo = seeds.to(torch.int32)  # int64 -> int32 keeps the low 32 bits
    seed_hi = torch.bitwise_right_shift(seeds, 32).to(torch.int32)
    h = pos.to(torch.int32).bitwise_xor(_as_int32(_POS_SALT))
    tmp = torch.empty_like(h)
    _Int32Hasher.fmix32_(h, tmp).bitwise_xor_(seed_lo)
    _Int32Hasher.fmix32_(h, tmp).bitwise_xor_(seed_hi)
    return _Int32Hasher.fmix32_(h, tmp)


_vocab_terms: dict[tuple[int, torch.device], torch.Tensor] = {}


def _vocab_term(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[vocab] int32: v * _VOCAB_MUL mod 2**32, cached."""
    term = _vocab_terms.get((vocab_size, device))
    if term is None:
        v = torch.arange(vocab_size, dtype=torch.int64)
        term = ((v * _VOCAB_MUL) & 0xFFFFFFFF).to(torch.int32).to(device)
        _vocab_terms[(vocab_size, device)] = term
    return term


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_rows, vocab] float32 standard Gumbel noise for the given row keys."""
    h = torch.add(_vocab_term(vocab_size, keys.device).unsqueeze(0), keys.unsqueeze(1))
    tmp = torch.empty_like(h)
    _Int32Hasher.fmix32_(h, tmp)
    torch.bitwise_right_shift(h, 9, out=tmp)
    tmp.bitwise_and_(0x7FFFFF)
    u = tmp.to(torch.float32).mul_(2.0).add_(1.0).mul_(_UNIFORM_SCALE)
    return u.log_().neg_().log_().neg_()


def _gumbel_sample_torch(logits: torch.Tensor, idx_mapping: torch.Tensor,
                         temperature: torch.Tensor, seeds: torch.Tensor, pos: torch.Tensor,
                         is_greedy_np: np.ndarray | None) -> torch.Tensor:
    rows = idx_mapping.to(torch.int64)
    if is_greedy_np is None:
        is_greedy_np = (temperature[rows] == 0.0).cpu().numpy()
    random_idx = np.flatnonzero(~is_greedy_np)
    if random_idx.size == 0:
        return logits.argmax(dim=-1)
    if random_idx.size == logits.shape[0]:
        noisy = logits + gumbel_noise(row_keys(seeds[rows], pos), logits.shape[1])
        return noisy.argmax(dim=-1)
    sampled = logits.argmax(dim=-1)
    sel = torch.from_numpy(random_idx).to(logits.device)
    noise = gumbel_noise(row_keys(seeds[rows[sel]], pos[sel]), logits.shape[1])
    sampled[sel] = noise.add_(logits[sel]).argmax(dim=-1)
    return sampled


# ---- Triton path ---------------------------------------------------------------------

@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h


@triton.jit
def _gumbel_sample_kernel(out_ptr, logits_ptr, logits_stride, idx_mapping_ptr, temp_ptr,
                          seeds_ptr, pos_ptr, vocab_size, BLOCK_SIZE: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(idx_mapping_ptr + i).to(tl.int64)
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + i).to(tl.int64)
    key = _fmix32(pos.to(tl.uint32) ^ 0x7F4A7C15)
    key = _fmix32(key ^ seed.to(tl.uint32))
    key = _fmix32(key ^ (seed >> 32).to(tl.uint32))

    best_val = -float("inf")
    best_idx = 0
    for start in range(0, vocab_size, BLOCK_SIZE):
        v = start + tl.arange(0, BLOCK_SIZE)
        mask = v < vocab_size
        x = tl.load(logits_ptr + i * logits_stride + v, mask=mask,
                    other=-float("inf")).to(tl.float32)
        if temp != 0.0:
            h = _fmix32(v.to(tl.uint32) * 0x9E3779B9 + key)
            u = ((h >> 9).to(tl.float32) * 2.0 + 1.0) * 5.9604644775390625e-08
            x = tl.where(mask, x - tl.log(-tl.log(u)), -float("inf"))
        val, idx = tl.max(x, axis=0, return_indices=True)
        # Strictly greater: ties keep the earlier block (torch.argmax's first index).
        best_idx = tl.where(val > best_val, start + idx, best_idx)
        best_val = tl.maximum(val, best_val)
    tl.store(out_ptr + i, best_idx.to(tl.int64))


def _gumbel_sample_triton(logits: torch.Tensor, idx_mapping: torch.Tensor,
                          temperature: torch.Tensor, seeds: torch.Tensor,
                          pos: torch.Tensor) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    _gumbel_sample_kernel[(num_rows,)](out, logits, logits.stride(0), idx_mapping,
                                       temperature, seeds, pos.contiguous(), vocab_size,
                                       BLOCK_SIZE=1024)
    return out
