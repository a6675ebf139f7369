"""Loading tokenizers (upstream: vllm/transformers_utils/tokenizer.py).

Every model is a local path here (no hub). A `.gguf` file carries its
tokenizer in its metadata; transformers converts it when asked with
`AutoTokenizer.from_pretrained(folder, gguf_file=name)`. That conversion
takes seconds, so the converted tokenizer is saved once under
`~/.cache/vllm/gguf_tokenizers/` (keyed on the file's path, size and mtime)
and later start-ups load the saved `tokenizer.json` in a fraction of that.
Loaded tokenizers are also cached per process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)

# Any Hugging Face tokenizer (fast or slow). The loaders below use more of it
# (`is_fast`, `save_pretrained`); what they hand out is typed `TokenizerLike`,
# the part the engine and the front end use.
AnyTokenizer = Any

_CACHE: dict[tuple, AnyTokenizer] = {}


def get_tokenizer(
    tokenizer_name: str | os.PathLike,
    tokenizer_mode: str = "auto",
    trust_remote_code: bool = False,
    revision: str | None = None,
    **kwargs: Any,
) -> TokenizerLike:
    """Load a tokenizer from a local model folder or a `.gguf` file.

    tokenizer_mode: "auto" prefers the fast (Rust) tokenizer, "slow" asks for
    the Python one. Raises ValueError for a path that does not exist.
    """
    name = str(tokenizer_name)
    key = (
        name,
        tokenizer_mode,
        trust_remote_code,
        revision,
        tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
    )
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    if not os.path.exists(name):
        raise ValueError(
            f"Tokenizer path {name!r} does not exist. Models are loaded from local "
            "paths only: pass a model folder or a .gguf file."
        )
    if tokenizer_mode == "slow":
        if kwargs.get("use_fast", False):
            raise ValueError("Cannot use the fast tokenizer in slow tokenizer mode.")
        kwargs["use_fast"] = False
    if name.endswith(".gguf"):
        tokenizer = _load_gguf_tokenizer(name, trust_remote_code, **kwargs)
    else:
        tokenizer = _from_pretrained(
            name, trust_remote_code=trust_remote_code, revision=revision, **kwargs
        )
    if tokenizer_mode == "slow" and getattr(tokenizer, "is_fast", False):
        # transformers gives the fast tokenizer when it has no slow one for
        # this model (always for tokenizer.json-only folders and GGUF files).
        raise ValueError(
            f"tokenizer_mode='slow' (--tokenizer-mode) cannot be honoured for "
            f"{name!r}: transformers has no slow (Python) tokenizer for it. "
            "Use tokenizer_mode='auto'."
        )
    _CACHE[key] = tokenizer
    return tokenizer


def _from_pretrained(path: str, **kwargs: Any) -> AnyTokenizer:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"Could not load a tokenizer from {path!r}: {e}") from e


def _load_gguf_tokenizer(path: str, trust_remote_code: bool, **kwargs: Any) -> AnyTokenizer:
    """Load the tokenizer embedded in a GGUF file, through the on-disk cache."""
    cache_dir = _gguf_cache_dir(path)
    if cache_dir is not None and (cache_dir / "tokenizer_config.json").exists():
        try:
            return _from_pretrained(str(cache_dir), trust_remote_code=trust_remote_code, **kwargs)
        except ValueError:
            logger.warning("Ignoring an unreadable tokenizer cache at %s", cache_dir)
    gguf = Path(path)
    tokenizer = _from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, trust_remote_code=trust_remote_code, **kwargs
    )
    if cache_dir is not None and not kwargs:
        _save_atomically(tokenizer, cache_dir)
    return tokenizer


def _gguf_cache_dir(path: str) -> Path | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:24]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "vllm" / "gguf_tokenizers" / digest


def _save_atomically(tokenizer: AnyTokenizer, cache_dir: Path) -> None:
    """Write into a temporary sibling, then rename: readers never see half a save."""
    try:
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=".tmp-"))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            # Another process saved it first; theirs is as good as ours.
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        logger.debug("Not caching the GGUF tokenizer (%s)", e)


def cached_tokenizer_from_config(model_config: Any, **kwargs: Any) -> TokenizerLike:
    """The tokenizer a `ModelConfig` names (upstream helper of the same name)."""
    return get_tokenizer(
        model_config.tokenizer,
        tokenizer_mode=model_config.tokenizer_mode,
        trust_remote_code=model_config.trust_remote_code,
        revision=getattr(model_config, "tokenizer_revision", None),
        **kwargs,
    )
