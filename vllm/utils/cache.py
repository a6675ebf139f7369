"""An LRU cache with pinning (upstream: vllm/utils/cache.py `LRUCache`).

Upstream builds it on `cachetools.LRUCache`; cachetools is not a dependency
here, so this is an `OrderedDict` keeping the order from least to most
recently used. Reading (`[]`, `get`) or `touch` moves a key to the most
recent end; inserting over capacity evicts the least recently used key that
is not pinned. Subclasses hook every removal (eviction, `pop`, `del`,
`clear`) through `_on_remove`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar, overload

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")


class LRUCache(Generic[_K, _V]):
    """At most `capacity` entries; pinned keys are never evicted by the LRU
    order (only removed explicitly)."""

    def __init__(self, capacity: float) -> None:
        self._capacity = capacity
        self._data: OrderedDict[_K, _V] = OrderedDict()
        self.pinned_items: set[_K] = set()

    @property
    def capacity(self) -> float:
        return self._capacity

    @property
    def cache(self) -> Mapping[_K, _V]:
        """The entries, least recently used first (read-only)."""
        return MappingProxyType(self._data)

    @property
    def order(self) -> list[_K]:
        """The keys, least recently used first."""
        return list(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[_K]:
        return iter(list(self._data))

    def __getitem__(self, key: _K) -> _V:
        value = self._data[key]
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: _K, value: _V) -> None:
        self.insert(key, value)

    def insert(self, key: _K, value: _V, *, evict: bool = True) -> None:
        """Set `key` most recently used; a new key first evicts down to
        capacity (`evict=False`: no eviction, the cache may exceed it)."""
        if key in self._data:
            self._data[key] = value
            self._data.move_to_end(key)
            return
        while evict and len(self._data) >= self._capacity:
            self.remove_oldest()
        self._data[key] = value

    def __delitem__(self, key: _K) -> None:
        value = self._data.pop(key)
        self.pinned_items.discard(key)
        self._on_remove(key, value)

    def put(self, key: _K, value: _V) -> None:
        self[key] = value

    def touch(self, key: _K) -> None:
        """Mark `key` most recently used (no-op when absent)."""
        if key in self._data:
            self._data.move_to_end(key)

    @overload
    def get(self, key: _K, /) -> _V | None: ...

    @overload
    def get(self, key: _K, /, default: _V | _T) -> _V | _T: ...

    def get(self, key: _K, /, default: _V | _T | None = None) -> _V | _T | None:
        return self[key] if key in self._data else default

    @overload
    def pop(self, key: _K) -> _V | None: ...

    @overload
    def pop(self, key: _K, default: _V | _T) -> _V | _T: ...

    def pop(self, key: _K, default: _V | _T | None = None) -> _V | _T | None:
        if key not in self._data:
            return default
        value = self._data[key]
        del self[key]
        return value

    def pin(self, key: _K) -> None:
        """Keep `key` out of LRU eviction."""
        if key not in self._data:
            raise ValueError(f"Cannot pin key: {key} not in cache.")
        self.pinned_items.add(key)

    def _on_remove(self, key: _K, value: _V | None) -> None:
        """Called after an entry left the cache."""

    def remove_oldest(self, *, remove_pinned: bool = False) -> None:
        """Evict the least recently used entry (skipping pinned ones unless
        `remove_pinned`); RuntimeError when every entry is pinned."""
        if not self._data:
            return
        candidates = [k for k in self._data if remove_pinned or k not in self.pinned_items]
        if not candidates:
            raise RuntimeError("All items are pinned, cannot remove oldest from the cache.")
        del self[candidates[0]]

    def clear(self) -> None:
        while self._data:
            self.remove_oldest(remove_pinned=True)
