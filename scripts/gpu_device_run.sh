#!/bin/sh
# The GPU check on the lent GPU machine, in two calls (at most 64 MiB of files go over in one):
#   1. carry .gpu/smollm2.gguf.part00                                  sh scripts/gpu_device_run.sh stash
#   2. carry .gpu/smollm2.gguf.part01 .gpu/wheels .gpu/smollm2.sha256  sh scripts/gpu_device_run.sh
# (scripts/gpu_prepare.sh makes .gpu/ here first). The first part waits in /tmp between the calls.
set -e
S=/tmp/specdec-gpu
mkdir -p "$S"
if [ "$1" = stash ]; then cp .gpu/smollm2.gguf.part00 "$S/"; ls -l "$S"; exit 0; fi
cat "$S/smollm2.gguf.part00" .gpu/smollm2.gguf.part01 > "$S/smollm2.gguf"
echo "$(cat .gpu/smollm2.sha256)  $S/smollm2.gguf" | sha256sum -c
python3 -m zipfile -e .gpu/wheels/gguf-0.19.0-py3-none-any.whl "$S/py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
out="${OUT:-.}/gpu-check"
PYTHONPATH="$S/py" SPECDEC_CACHE="$S/cache" timeout 480 python3 scripts/gpu_check.py --device cuda \
  --smollm2 "$S/smollm2.gguf" --out "$out" 2>&1 | tee "$out.log"
