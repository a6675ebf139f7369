#!/usr/bin/env bash
# GPU check for one H200 (issue 8). Step timeouts add up to about 9 minutes;
# everything printed is also written to $OUT/gpu_check.log when $OUT is set
# (the device tool's result folder), so a killed run still reports. From the
# repository root:
#   bash benchmarks/gpu_check.sh [python]
# 1. environment; 2. build the ops in place: vllm._C (CPU) and, as the torch
# here is a CUDA build and nvcc is found, vllm._C_cuda (csrc/*.cu) for sm_90
# only (TORCH_CUDA_ARCH_LIST overrides); 3. the GPU tests in one pytest run
# (xdist when installed): every torch.ops._C / _C_cache_ops op vs a torch
# reference, the Triton unified attention compiled for the GPU, FlashInfer
# (skips when not installed), CUDA graph capture + replay and graphs on/off
# parity through both runners (FULL and PIECEWISE), no host sync in V2's
# decode step (sync debug mode); 4. greedy parity V1/V2 x TRITON_ATTN (eager,
# FULL_DECODE_ONLY, FULL, FULL_AND_PIECEWISE under VLLM_COMPILE) / CPU_ATTN (eager) and decode step times
# with and without graphs; 5. (STEPS=real) issue 22's real-size check,
# benchmarks/gpu_real_size.py: Llama-3-8B shapes with dummy weights, decode
# at batch 1-256 over 1k contexts and prefill at 2k-8k tokens per step, V1/V2
# x eager / FULL_AND_PIECEWISE, each next to its HBM or bf16-peak floor.
# STEPS picks the steps after the build (default "tests parity"; the device
# budget holds about one of "tests parity" or "real"):
#   STEPS=real bash benchmarks/gpu_check.sh
set -uo pipefail
STEPS=${STEPS:-tests parity}
want() { [[ " $STEPS " == *" $1 "* ]]; }
PY=${1:-${PY:-.venv/bin/python}}
[ -x "$PY" ] || PY=python3
LOG=${OUT:-/tmp}/gpu_check.log
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - T0 )) s)"; }

step "environment"
# Wheels carried from benchmarks/gpu_wheels.sh (the image lacks msgspec, pyzmq, ...).
if ls .whl/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# FlashInfer's wheel in two halves (benchmarks/gpu_wheels.sh FLASHINFER=1).
if [ -f .fi1/part-aa ] && [ -f .fi2/part-ab ]; then
  mkdir -p /tmp/fi_wheel && cat .fi1/part-aa .fi2/part-ab > "/tmp/fi_wheel/$(cat .fi1/NAME)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site /tmp/fi_wheel/*.whl .fi2/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} \
    && echo "flashinfer installed"
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
command -v nvcc && nvcc --version | tail -1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), 'triton', triton.__version__)" || exit 1

step "build vllm._C and vllm._C_cuda (in place)"
# setup.py never fails on a failed compile: it says what it skipped ("vllm: ...").
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} timeout 150 "$PY" setup.py build_ext --inplace \
  > /tmp/gpu_check_build.log 2>&1 && echo "build ok" \
  || { echo "build failed (tail):"; tail -30 /tmp/gpu_check_build.log; }
grep -E "^vllm: |error|CMake Error" /tmp/gpu_check_build.log | head -20
[ -n "${OUT:-}" ] && cp /tmp/gpu_check_build.log "$OUT/" 2>/dev/null
"$PY" -c "from vllm import _custom_ops as o; print('CPU ops:', o.cpu_ops_available(), \
o.cpu_ops_load_error() or ''); print('CUDA ops:', o.cuda_ops_available(), o.cuda_ops_load_error() or '')"

if want tests; then
step "GPU tests: CUDA ops, Triton / FlashInfer attention, selector, CUDA graphs"
XDIST=""
"$PY" -c "import xdist" 2> /dev/null && XDIST="-n 6"
TMO=""
"$PY" -c "import pytest_timeout" 2> /dev/null && TMO="--timeout 90"
timeout 180 "$PY" -m pytest -q $XDIST $TMO -p no:cacheprovider tests/kernels/test_cuda_ops.py \
  tests/kernels/test_triton_unified_attention.py tests/kernels/test_flashinfer_backend.py \
  tests/kernels/test_attention_selector.py tests/v1/cudagraph \
  tests/v1/worker/gpu/test_no_host_sync_gpu.py -rfEs 2>&1 \
  | tee "${OUT:-/tmp}/gpu_pytest.log" \
  | grep -vE "^(SKIPPED|\.|s)+ *(\[ *[0-9]+%\])?$" | tail -60
fi

if want parity; then
step "greedy parity and decode step time, graphs on/off"
timeout 300 "$PY" benchmarks/kernels/gpu_parity.py --workdir /tmp/gpu_check \
  --child-timeout 80 2>&1 | grep -v "^INFO"
fi

if want real; then
step "real size: Llama-3-8B shapes (dummy weights) against the H200's floors"
timeout 500 "$PY" benchmarks/gpu_real_size.py --workdir /tmp/gpu_real_size \
  --child-timeout 160 --json "${OUT:-/tmp}/gpu_real_size.json" 2>&1 | grep -v "^INFO"
fi

step "done"
