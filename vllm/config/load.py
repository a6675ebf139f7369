"""Weight loading configuration (upstream: vllm/config/load.py)."""

from __future__ import annotations

from dataclasses import dataclass

_LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")


@dataclass
class LoadConfig:
    load_format: str = "auto"  # auto: .gguf -> gguf, else safetensors, else pt
    download_dir: str | None = None

    def __post_init__(self) -> None:
        if self.load_format not in _LOAD_FORMATS:
            raise ValueError(
                f"Unknown load_format {self.load_format!r}; choose one of {_LOAD_FORMATS}."
            )
        if self.download_dir is not None:
            raise ValueError(
                f"download_dir={self.download_dir!r} (--download-dir) cannot be honoured: "
                "models are loaded from local paths only and nothing is downloaded."
            )
