#!/usr/bin/env bash
# GPU check for one H200 (issue 8), under 8 minutes. UNTESTED: no GPU was
# available where it was written. Run from the repository root:
#   bash benchmarks/gpu_check.sh [python]
# 1. environment; 2. build the ops (CPU ops only: no CUDA sources exist in
# csrc/ yet, so there is nothing for nvcc to build); 3. kernel tests, with the
# Triton unified attention compiled for the GPU; 4. CUDA graph tests (capture +
# replay, graphs on/off parity through both runners), then greedy parity V1/V2
# x TRITON_ATTN (eager, FULL_DECODE_ONLY, FULL graphs) / CPU_ATTN (eager) and
# decode step times with and without graphs.
set -uo pipefail
PY=${1:-${PY:-.venv/bin/python}}
[ -x "$PY" ] || PY=python3
T0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - T0 )) s)"; }

step "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), 'triton', triton.__version__)" || exit 1

step "build vllm._C (in place)"
timeout 240 "$PY" setup.py build_ext --inplace > /tmp/gpu_check_build.log 2>&1 \
  && echo "build ok" || { echo "build failed (tail):"; tail -20 /tmp/gpu_check_build.log; }

step "kernel tests (CPU ops, selector, Triton interpreter + GPU)"
timeout 240 "$PY" -m pytest -q tests/kernels -x 2>&1 | tail -15

step "CUDA graph tests (GPU)"
timeout 240 "$PY" -m pytest -q tests/v1/cudagraph -x 2>&1 | tail -15

step "greedy parity and decode step time, graphs on/off"
timeout 420 "$PY" benchmarks/kernels/gpu_parity.py --workdir /tmp/gpu_check 2>&1 | grep -v "^INFO"

step "done"
