"""Which manager serves each KV cache spec type, and which types group together
(upstream: vllm/v1/kv_cache_spec_registry.py).

Each spec class is registered with the `SingleTypeKVCacheManager` that
allocates its blocks and a "uniform type base": layers whose specs share a base
need the same number of token slots and can share one KV cache group
(`UniformTypeKVCacheSpecs`). A built-in spec type names its own base
(`KVCacheSpec.default_uniform_type_base`, which `kv_cache_spec.uniform_type_base`
falls back to), so grouping works before any registration;
`register_all_kvcache_specs` in `vllm.v1.core.single_type_kv_cache_manager`
registers the built-in managers when the first manager is built.

This module is a leaf: the specs import it, and it imports nothing from them or
from vllm.v1.core. So its records hold plain classes (`type`): a KVCacheSpec
subclass, a SingleTypeKVCacheManager subclass and the spec's grouping base.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheSpecMetadata:
    kvcache_spec_cls: type
    manager_class: type
    uniform_type_base_spec: type


_REGISTRY: dict[type, KVCacheSpecMetadata] = {}


class KVCacheSpecRegistry:
    """Global registry: spec class -> manager class and grouping base."""

    @classmethod
    def register(
        cls,
        kvcache_spec_cls: type,
        manager_class: type | None = None,
        uniform_type_base_spec: type | None = None,
    ) -> None:
        """Register a spec class; re-registering it the same way is a no-op,
        differently an error."""
        if manager_class is None:
            raise ValueError(f"{kvcache_spec_cls.__name__}: manager_class is required")
        base = uniform_type_base_spec or kvcache_spec_cls
        if not issubclass(kvcache_spec_cls, base):
            raise ValueError(
                f"{kvcache_spec_cls.__name__} must inherit from its declared "
                f"uniform_type_base_spec {base.__name__}."
            )
        entry = KVCacheSpecMetadata(kvcache_spec_cls, manager_class, base)
        old = _REGISTRY.get(kvcache_spec_cls)
        if old is not None and old != entry:
            raise ValueError(
                f"Conflicting registration for KVCacheSpec: {kvcache_spec_cls.__name__}"
            )
        _REGISTRY[kvcache_spec_cls] = entry

    @classmethod
    def _lookup(cls, spec: object) -> KVCacheSpecMetadata | None:
        for klass in type(spec).__mro__:  # nearest registered ancestor
            if klass in _REGISTRY:
                return _REGISTRY[klass]
        return None

    @classmethod
    def get_manager_class(cls, spec: object) -> type | None:
        """The manager class registered for the spec's type (or nearest
        registered base); None if there is none (yet)."""
        entry = cls._lookup(spec)
        return entry.manager_class if entry else None

    @classmethod
    def get_uniform_type_base_spec(cls, spec: object) -> type | None:
        """The grouping base registered for the spec's type (or nearest
        registered base); None if there is none (yet)."""
        entry = cls._lookup(spec)
        return entry.uniform_type_base_spec if entry else None
