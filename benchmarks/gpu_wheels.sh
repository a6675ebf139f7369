#!/usr/bin/env bash
# Fetch, on this (networked) machine, the wheels that the lent H200 lacks for
# benchmarks/gpu_check.sh: its image has torch (CUDA), triton, transformers,
# safetensors, numpy, psutil, xxhash, jinja2, ... but not these. They land in
# .whl/ (git-ignored via .git/info/exclude), which the device call carries:
#   bash benchmarks/gpu_wheels.sh
#   device run: carry [".whl"], command "bash benchmarks/gpu_check.sh python3"
# FlashInfer (FLASHINFER=1): its wheel (flashinfer-python 0.7.4: 101 MB, JIT
# sources included) exceeds the 64 MiB one device call may carry, so it is
# split into .fi1/ (60 MB) and .fi2/ (the rest, with the small pure-Python or
# manylinux dependencies `import flashinfer` may need), carried by two calls to
# the same warm machine (ignored paths already there are kept between calls):
#   call 1: carry [".fi1"], command "true"
#   call 2: carry [".whl", ".fi2"], command "bash benchmarks/gpu_check.sh python3"
# gpu_check.sh joins and installs it when both halves are there; without it
# the FlashInfer tests skip. Its kernels JIT-compile on the device (nvcc).
# Not yet tried on the device: whether the image has the rest of its
# requirements (cuda-python, nvidia-cutlass-dsl, ...) is for that run to say.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PY:-.venv/bin/python}
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64; do
  PLATFORMS+=(--platform "$p")
done
# Python 3.12 there; one version of each, pydantic-core pinned by pydantic.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl \
  msgspec pyzmq cbor2 gguf "pydantic==2.14.4" "pydantic-core==2.50.5" \
  annotated-types typing-inspection
ls -la .whl
if [ "${FLASHINFER:-0}" = 1 ]; then
  rm -rf .fi1 .fi2 && mkdir -p .fi1 .fi2 /tmp/fi_wheel
  grep -qx '/.fi1/' .git/info/exclude || printf '/.fi1/\n/.fi2/\n' >> .git/info/exclude
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d /tmp/fi_wheel flashinfer-python
  wheel=$(ls /tmp/fi_wheel/flashinfer_python-*.whl | head -1)
  split -b 60M "$wheel" /tmp/fi_wheel/part-
  mv /tmp/fi_wheel/part-aa .fi1/ && mv /tmp/fi_wheel/part-ab .fi2/
  basename "$wheel" > .fi1/NAME
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d .fi2 "apache-tvm-ffi>=0.1.11,<0.2" ninja einops tabulate
  ls -la .fi1 .fi2
fi
