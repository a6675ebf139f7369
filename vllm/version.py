"""The package version (upstream: vllm/version.py)."""

__version__ = "0.28.0"
__version_tuple__ = (0, 28, 0)
