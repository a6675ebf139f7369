"""Engine configuration, one dataclass per concern (upstream: vllm/config/)."""

from vllm.config.attention import AttentionConfig
from vllm.config.cache import CacheConfig
from vllm.config.compilation import CompilationConfig, CompilationMode, CUDAGraphMode
from vllm.config.device import DeviceConfig
from vllm.config.ec_transfer import ECTransferConfig
from vllm.config.kv_events import KVEventsConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.config.load import LoadConfig
from vllm.config.lora import LoRAConfig
from vllm.config.model import ModelConfig
from vllm.config.observability import ObservabilityConfig
from vllm.config.parallel import ParallelConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.config.structured_outputs import StructuredOutputsConfig
from vllm.config.vllm import (
    DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES,
    VllmConfig,
    get_current_vllm_config,
    get_current_vllm_config_or_none,
    set_current_vllm_config,
)

__all__ = [
    "AttentionConfig",
    "CacheConfig",
    "CompilationConfig",
    "CompilationMode",
    "CUDAGraphMode",
    "DeviceConfig",
    "LoadConfig",
    "LoRAConfig",
    "ModelConfig",
    "ObservabilityConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "StructuredOutputsConfig",
    "VllmConfig",
    "ECTransferConfig",
    "KVEventsConfig",
    "KVTransferConfig",
    "SpeculativeConfig",
    "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES",
    "get_current_vllm_config",
    "get_current_vllm_config_or_none",
    "set_current_vllm_config",
]
