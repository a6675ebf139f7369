#!/usr/bin/env bash
# GPU check for one H200 (issue 8); the step timeouts add up to 9 minutes, a
# typical run should take 3-5. UNTESTED: no GPU was
# available where it was written. Run from the repository root:
#   bash benchmarks/gpu_check.sh [python]
# 1. environment; 2. build the ops in place: vllm._C (CPU) and, as the torch
# here is a CUDA build and nvcc is found, vllm._C_cuda (csrc/*.cu) for sm_90
# only (TORCH_CUDA_ARCH_LIST overrides); 3. CUDA op tests
# (tests/kernels/test_cuda_ops.py: every torch.ops._C / _C_cache_ops op vs a
# torch reference), then the other kernel tests, with the Triton unified
# attention compiled for the GPU; 4. CUDA graph tests (capture +
# replay, graphs on/off parity through both runners), then greedy parity V1/V2
# x TRITON_ATTN (eager, FULL_DECODE_ONLY, FULL graphs) / CPU_ATTN (eager) and
# decode step times with and without graphs.
set -uo pipefail
PY=${1:-${PY:-.venv/bin/python}}
[ -x "$PY" ] || PY=python3
T0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - T0 )) s)"; }

step "environment"
# Wheels carried from benchmarks/gpu_wheels.sh (the image lacks msgspec, pyzmq, ...).
if ls .whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), 'triton', triton.__version__)" || exit 1

step "build vllm._C and vllm._C_cuda (in place)"
# setup.py never fails on a failed compile: it says what it skipped ("vllm: ...").
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} timeout 180 "$PY" setup.py build_ext --inplace \
  > /tmp/gpu_check_build.log 2>&1 && echo "build ok" \
  || { echo "build failed (tail):"; tail -20 /tmp/gpu_check_build.log; }
grep -E "^vllm: |error" /tmp/gpu_check_build.log | head -20
"$PY" -c "from vllm import _custom_ops as o; print('CPU ops:', o.cpu_ops_available(), \
o.cpu_ops_load_error() or ''); print('CUDA ops:', o.cuda_ops_available(), o.cuda_ops_load_error() or '')"

step "CUDA op tests (GPU: torch.ops._C / _C_cache_ops vs torch references)"
timeout 60 "$PY" -m pytest -q tests/kernels/test_cuda_ops.py 2>&1 | tail -25

step "attention kernel tests on the GPU (Triton unified attention, FlashInfer, selector)"
timeout 60 "$PY" -m pytest -q -x tests/kernels/test_triton_unified_attention.py \
  tests/kernels/test_flashinfer_backend.py tests/kernels/test_attention_selector.py 2>&1 | tail -15

step "CUDA graph tests (GPU)"
timeout 90 "$PY" -m pytest -q tests/v1/cudagraph -x 2>&1 | tail -15

step "greedy parity and decode step time, graphs on/off"
timeout 150 "$PY" benchmarks/kernels/gpu_parity.py --workdir /tmp/gpu_check 2>&1 | grep -v "^INFO"

step "done"
