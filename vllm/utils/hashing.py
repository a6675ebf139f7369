"""Hash functions used for prefix-caching block hashes.

Every function takes an arbitrary (serialisable) Python object and returns the
digest as ``bytes``. The object is only ever *serialised* here (pickle or
canonical CBOR); nothing is ever deserialised, so hashing untrusted input is
safe.

Which function the engine uses is chosen by
``CacheConfig.prefix_caching_hash_algo`` through :func:`get_hash_fn_by_name`.
"""

import hashlib
import pickle
from collections.abc import Callable
from types import ModuleType
from typing import Any

import cbor2


def _import_xxhash() -> ModuleType | None:
    """xxhash is optional; only the xxhash* algorithms need it."""
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


_xxhash = _import_xxhash()


def sha256(input: Any) -> bytes:
    """SHA-256 of ``pickle.dumps(input)`` (highest protocol).

    Fast and collision resistant, but the digest depends on CPython's pickle
    format, so it is only reproducible between Python processes.
    """
    input_bytes = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(input_bytes).digest()


def sha256_cbor(input: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding of ``input``.

    Canonical CBOR is language independent, so other programs (e.g. a router
    that predicts cache hits) can reproduce these digests.
    """
    input_bytes = cbor2.dumps(input, canonical=True)
    return hashlib.sha256(input_bytes).digest()


def _xxhash_digest(input_bytes: bytes) -> bytes:
    if _xxhash is None:
        raise ModuleNotFoundError(
            "xxhash is required for the 'xxhash' prefix caching hash "
            "algorithms. Install it via `pip install xxhash`."
        )
    # 128-bit XXH3: not cryptographic, hence the random NONE_HASH seed that
    # kv_cache_utils.init_none_hash uses for it.
    return _xxhash.xxh3_128_digest(input_bytes)


def xxhash(input: Any) -> bytes:
    """XXH3-128 of ``pickle.dumps(input)``: faster, not collision resistant."""
    return _xxhash_digest(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input: Any) -> bytes:
    """XXH3-128 of the canonical CBOR encoding of ``input``."""
    return _xxhash_digest(cbor2.dumps(input, canonical=True))


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}


def get_hash_fn_by_name(hash_fn_name: str) -> Callable[[Any], bytes]:
    """Return the hash function called ``hash_fn_name``.

    Raises:
        ValueError: if the name is not one of sha256, sha256_cbor, xxhash,
            xxhash_cbor.
    """
    try:
        return _HASH_FNS[hash_fn_name]
    except KeyError:
        raise ValueError(f"Unsupported hash function: {hash_fn_name}") from None
