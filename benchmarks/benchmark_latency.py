"""Single-batch latency benchmark; the same code as `vllm bench latency`.

python benchmarks/benchmark_latency.py --input-len 32 --output-len 128 --batch-size 8
"""

import sys

from vllm.entrypoints.cli.main import main

if __name__ == "__main__":
    main(["bench", "latency", *sys.argv[1:]])
