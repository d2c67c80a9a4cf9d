#!/bin/sh
# The GPU check on a lent GPU machine (docs/gpu.md), from preparing its files here to its two calls there.
#   0. here, first: sh scripts/gpu_device.sh prepare
#      what the GPU machine needs beside the working tree, in .gpu/ (ignored by git): SmolLM2-135M's
#      GGUF in two parts (98 MB, and at most 64 MiB of files go over in one call), the gguf wheel (the
#      conversion to safetensors reads it; that machine has no network) and the server's packages
#      (FastAPI, uvicorn, pydantic), and the commit the check runs.
# Then on the GPU machine, in two calls (at most 64 MiB of files go over in one):
#   1. carry .gpu/smollm2.gguf.part00 .gpu/commit                      sh scripts/gpu_device.sh arch
#      stashes the first part in /tmp, then the random-weight 1.5B architecture through the engine on
#      CUDA graphs (its plain step after a short and a long prompt, per attention; exactness)
#   2. carry .gpu/smollm2.gguf.part01 .gpu/wheels .gpu/smollm2.sha256 .gpu/commit
#                                                                      sh scripts/gpu_device.sh smollm2
#      SmolLM2-135M's real weights: the GPU server under load against transformers' continuous
#      batching (serve), then one request at a time on Spec-Bench against transformers' compiled
#      static cache (smollm2)
# Make the second call right after the first: a warm machine goes back after about 30 s idle, and
# the stashed part with it (step 0 makes .gpu/ here first). Each part has a time
# limit, so both calls fit a 15-minute lease with the machine's start; a part cut short still leaves
# the report of what it measured (gpu_check.py writes it after every step).
set -e
if [ "$1" = prepare ]; then
  cd "$(dirname "$0")/.."
  PY=${PY:-.venv/bin/python}
  mkdir -p .gpu/wheels
  gguf=$($PY -c "from specdec.models import resolve; print(resolve('smollm2-135m', None, need_hf=False).gguf)")
  split -n 2 -d "$gguf" .gpu/smollm2.gguf.part
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' > .gpu/smollm2.sha256
  $PY -m pip download -q --disable-pip-version-check --no-deps gguf==0.19.0 -d .gpu/wheels
  # The server's packages the GPU machine lacks (its Python is 3.12), at the versions tested here.
  $PY -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/wheels fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 uvicorn==0.54.0 annotated-doc==0.0.7 \
    opentelemetry-api==1.45.2
  # The commit the check runs (the GPU machine gets the working tree, not the repository).
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src scripts || echo ' with uncommitted changes')" > .gpu/commit
  ls -l .gpu .gpu/wheels
  exit 0
fi
S=/tmp/specdec-gpu
mkdir -p "$S"
export PYTHONUNBUFFERED=1 SPECDEC_CACHE="$S/cache"
out="${OUT:-.}"
code=$(cat .gpu/commit 2>/dev/null || echo "not recorded")  # carried with either call
if [ "$1" = stash ]; then cp .gpu/smollm2.gguf.part00 "$S/"; exit 0; fi  # a second smollm2 run on a fresh machine
if [ "$1" = arch ]; then
  shift  # what follows "arch" goes to gpu_check.py
  cp .gpu/smollm2.gguf.part00 "$S/"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"  || true
  timeout -k 20 240 python3 scripts/gpu_check.py --device cuda --parts arch --archs qwen2.5-coder-1.5b --code "$code" \
    --out "$out/gpu-check-arch" "$@" >"$out/gpu-check-arch.log" 2>&1 || echo "arch part: exit $?"
  cat "$out/gpu-check-arch.log"
  exit 0
fi
shift  # what follows "smollm2" goes to gpu_check.py (--parts, --budget-s ...)
cat "$S/smollm2.gguf.part00" .gpu/smollm2.gguf.part01 > "$S/smollm2.gguf"
echo "$(cat .gpu/smollm2.sha256)  $S/smollm2.gguf" | sha256sum -c
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S/py" .gpu/wheels/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# Serving first (ours with and without drafting, then transformers' continuous batching, each warmed
# at every level's shape), then one request at a time while time is left. The check stops its
# servers when the time limit's SIGTERM comes; a check that does not end 20 s later is killed.
# transformers' continuous batching takes about 170 s to start (its compile; 2026-12-04), ours about 110 s
# for both servers' levels: the serve part gets 320 s of the 440.
PYTHONPATH="$S/py" timeout -k 20 440 python3 scripts/gpu_check.py --device cuda --parts serve,serve-peers,smollm2 \
  --budget-s 400 --budget-s-serve 320 --ready-s 200 --level-limit-s 60 --methods plain,ngram,hf-static \
  --smollm2 "$S/smollm2.gguf" \
  --code "$code" --out "$out/gpu-check-smollm2" "$@" >"$out/gpu-check-smollm2.log" 2>&1 || echo "smollm2 part: exit $?"
grep -v 'it/s]' "$out/gpu-check-smollm2.log" | grep -v Warning | tail -40
if [ -n "$WITH_ARCH" ]; then  # the architectures too, in the same call (no second start)
  timeout -k 20 100 python3 scripts/gpu_check.py --device cuda --parts arch --archs qwen2.5-coder-1.5b --attention paged \
    --code "$code" --out "$out/gpu-check-arch" >"$out/gpu-check-arch.log" 2>&1 || echo "arch part: exit $?"
  grep -v Warning "$out/gpu-check-arch.log" | tail -5
fi
