#!/bin/sh
# What the GPU machine needs beside the working tree, in .gpu/ (ignored by git): SmolLM2-135M's GGUF
# in two parts (98 MB, and at most 64 MiB of files go over in one call) and the gguf wheel (the
# conversion to safetensors reads it; that machine has no network). docs/gpu.md: the two calls.
set -e
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .gpu/wheels
gguf=$($PY -c "from specdec.models import resolve; print(resolve('smollm2-135m', None, need_hf=False).gguf)")
split -n 2 -d "$gguf" .gpu/smollm2.gguf.part
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' > .gpu/smollm2.sha256
$PY -m pip download -q --disable-pip-version-check --no-deps gguf==0.19.0 -d .gpu/wheels
# The commit the check runs (the GPU machine gets the working tree, not the repository).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src scripts || echo ' with uncommitted changes')" > .gpu/commit
ls -l .gpu .gpu/wheels
