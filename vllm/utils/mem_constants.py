"""Byte-size constants (upstream: vllm/utils/mem_constants.py)."""

KB_bytes = 1_000
"""Bytes in one kilobyte (KB)."""

KiB_bytes = 1 << 10
"""Bytes in one kibibyte (KiB)."""

MB_bytes = 1_000_000
"""Bytes in one megabyte (MB)."""

MiB_bytes = 1 << 20
"""Bytes in one mebibyte (MiB)."""

GB_bytes = 1_000_000_000
"""Bytes in one gigabyte (GB)."""

GiB_bytes = 1 << 30
"""Bytes in one gibibyte (GiB)."""
