"""The name -> class registry behind `ToolParserManager` and `ReasoningParserManager`.

Upstream keeps two copies of the same registry (vllm/tool_parsers and
vllm/reasoning); here both managers subclass this one and keep upstream's
public names (`tool_parsers` / `reasoning_parsers`, `lazy_parsers`,
`register_module`, `register_lazy_module`, `list_registered`, the getters and
the plugin importers).

Built-in parsers register lazily (module path and class name, imported on first
use, so `import vllm` does not import every parser); plugins register eagerly
with `@Manager.register_module("name")` in a file the server imports at start-up.
A leaf module: it imports nothing from vllm.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

_C = TypeVar("_C", bound=type)


class LazyParserRegistry:
    """Subclasses set `_kind` (for messages), `_base` (what a parser must
    subclass), `_plugin_flag`, `_classes` (their upstream-named dict) and
    `lazy_parsers`, each a class attribute of their own."""

    _kind: ClassVar[str]
    _base: ClassVar[type]
    _plugin_flag: ClassVar[str]
    _classes: ClassVar[dict[str, Any]]
    lazy_parsers: ClassVar[dict[str, tuple[str, str]]]

    @classmethod
    def _get(cls, name: str) -> Any:
        if name in cls._classes:
            return cls._classes[name]
        if name in cls.lazy_parsers:
            module_path, class_name = cls.lazy_parsers[name]
            parser = getattr(importlib.import_module(module_path), class_name)
            cls._classes[name] = parser
            return parser
        raise KeyError(
            f"{cls._kind} {name!r} not found; available: {', '.join(cls.list_registered())}"
        )

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls._classes) | set(cls.lazy_parsers))

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy_parsers[name] = (module_path, class_name)

    @classmethod
    def _register_module(
        cls, module: type, module_name: str | list[str] | None, force: bool
    ) -> None:
        if not (isinstance(module, type) and issubclass(module, cls._base)):
            raise TypeError(
                f"{cls._kind.lower()} must subclass {cls._base.__name__}, got {module!r}"
            )
        names = [module.__name__] if module_name is None else module_name
        for name in [names] if isinstance(names, str) else names:
            if not force and name in cls._classes:
                raise KeyError(f"{name!r} is already registered as {cls._classes[name]}")
            cls._classes[name] = module

    @classmethod
    def register_module(
        cls,
        name: str | list[str] | None = None,
        force: bool = True,
        module: type | None = None,
    ) -> Callable[[_C], _C] | type:
        """Register `module` under `name` (a decorator when `module` is None)."""
        if module is not None:
            cls._register_module(module, name, force)
            return module

        def decorator(parser: _C) -> _C:
            cls._register_module(parser, name, force)
            return parser

        return decorator

    @classmethod
    def _import_plugin(cls, plugin_path: str) -> None:
        """Run a plugin file, which registers its parsers."""
        module_name = os.path.splitext(os.path.basename(plugin_path))[0]
        spec = importlib.util.spec_from_file_location(module_name, plugin_path)
        if spec is None or spec.loader is None:
            raise ValueError(f"{cls._plugin_flag}: cannot load {plugin_path!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
