#!/bin/sh
# What the GPU machine needs beside the working tree, in .gpu/ (ignored by git): SmolLM2-135M's GGUF
# in two parts (98 MB, and at most 64 MiB of files go over in one call), the gguf wheel (the
# conversion to safetensors reads it; that machine has no network) and the server's packages
# (FastAPI, uvicorn, pydantic). DEVELOPERS.md (the GPU check): the two calls.
set -e
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
