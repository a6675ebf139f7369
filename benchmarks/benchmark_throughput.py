"""Offline throughput benchmark; the same code as `vllm bench throughput`.

python benchmarks/benchmark_throughput.py --input-len 128 --output-len 128 --num-prompts 64
"""

import sys

from vllm.entrypoints.cli.main import main

if __name__ == "__main__":
    main(["bench", "throughput", *sys.argv[1:]])
