"""vLLM on CPU as a benchmark peer: ``vllm-plain`` and ``vllm-ngram[:k=K]`` (its n-gram
speculation), each a worker process in vLLM's own virtual environment (``make vllm``) that keeps
the model loaded between questions. Optional: without that environment the methods are refused
with a clear message. The model is the transformers folder specdec caches for the alias, in fp32.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.base import Method, PeerContext, RunResult, peer, positive
from specdec.errors import SpecdecError
from specdec.models import resolve
from specdec.options import GenerationOptions

VLLM_PYTHON_ENV = "SPECDEC_VLLM_PYTHON"
DEFAULT_VENV = ".venv-vllm"


def vllm_python() -> str:
    """The interpreter of vLLM's environment: $SPECDEC_VLLM_PYTHON, else .venv-vllm in the current
    folder or the checkout's; a clear error when neither exists."""
    chosen = os.environ.get(VLLM_PYTHON_ENV)
    candidates = [Path(chosen)] if chosen else [Path.cwd() / DEFAULT_VENV / "bin" / "python",
                                                Path(__file__).resolve().parents[4] / DEFAULT_VENV / "bin" / "python"]
    for path in candidates:
        if path.exists():
            return str(path)
    raise SpecdecError(f"the vllm-* methods need vLLM on CPU in its own environment: run `make vllm` "
                       f"(or point {VLLM_PYTHON_ENV} at its python)")


class VllmWorker:
    """One vLLM worker process, model loaded once; ``generate`` is one request/answer round."""

    def __init__(self, model_dir: Path, ngram: int = 0) -> None:
        script = Path(__file__).resolve().parent.parent / "vllm_worker.py"
        cmd = [vllm_python(), str(script), "--model", str(model_dir)] + (["--ngram", str(ngram)] if ngram else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        ready = self.proc.stdout.readline()
        if not ready.strip():
            raise SpecdecError(f"vLLM could not load {model_dir} (run the worker by hand to see why: {' '.join(cmd)})")

    def generate(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the vLLM worker ended")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.close()


@dataclass
class VllmSettings:
    ngram: int = 0


def parse(spec: str, args: list[str], pairs: dict[str, str], target: str | None = None) -> VllmSettings:
    head = spec.split(":", 1)[0]
    if head == "vllm-plain" and not args and not pairs:
        return VllmSettings()
    if head == "vllm-ngram" and not args and set(pairs) <= {"k"}:
        return VllmSettings(ngram=positive(spec, pairs.get("k", "4")))
    raise SpecdecError(f"method {spec!r}: write vllm-plain or vllm-ngram[:k=K]")


@dataclass
class VllmMethod(Method):
    """vLLM on CPU (fp32) in a worker process of its own environment."""

    name: str
    worker: object  # VllmWorker
    options: GenerationOptions
    family: str = "vllm"

    def run(self, prompt_ids, max_new_tokens, seed, schema=None):
        s = self.options
        answer = self.worker.generate({"prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens,
                                       "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                                       "seed": seed})
        return RunResult(answer["token_ids"], answer["wall_s"])


def _build(context: PeerContext, spec: str, settings: VllmSettings) -> Method:
    worker = context.once(("vllm", settings.ngram),
                          lambda: VllmWorker(resolve(context.model_name).hf_dir, settings.ngram))
    return VllmMethod(spec, worker, context.options)


peer("vllm-plain", "vllm-plain", "vllm", parse=parse, available=vllm_python, baseline=True, order=30)(_build)
peer("vllm-ngram", "vllm-ngram[:k=K]", "vllm", parse=parse, available=vllm_python, order=31)(_build)
