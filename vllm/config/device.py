"""Device configuration (upstream: vllm/config/device.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DeviceConfig:
    device: str | torch.device = "auto"  # "auto", "cpu" or "cuda"
    device_type: str = field(init=False)

    def __post_init__(self) -> None:
        if self.device == "auto":
            self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            self.device_type = torch.device(self.device).type
        if self.device_type not in ("cpu", "cuda"):
            raise ValueError(f"Unsupported device {self.device!r}; use 'cpu' or 'cuda'.")
        if self.device_type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but no CUDA device is available.")
        self.device = torch.device(self.device_type)
