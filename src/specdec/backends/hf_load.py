"""The transformers backend's loader: weights onto the device, and sequences over them (growing
caches on a CPU, :mod:`specdec.backends.hf`; static caches with CUDA graphs on a GPU,
:mod:`specdec.backends.hf_static`)."""

from __future__ import annotations

import sys

import torch

from specdec.backends.hf import DTYPES, PAD_ROWS, HFBackend
from specdec.errors import SpecdecError
from specdec.registry import LoadedWeights, LoadRequest, backend


@backend("transformers", "PyTorch through Hugging Face transformers (float32, or bfloat16 on CPUs with "
                         "native bf16; bfloat16 or float16 on a CUDA GPU)", dtypes=tuple(DTYPES),
         devices=("cpu", "cuda"), layer_access=True, order=0)
def load_transformers(request: LoadRequest) -> LoadedWeights:
    """Load the safetensors cache onto the device; fp32 models on a CPU get this machine's tuned
    matmul kernels; on a GPU exact (the default there) pads every forward to one shape."""
    from transformers import AutoModelForCausalLM

    from specdec import devices
    from specdec.cpu import has_native_bf16
    from specdec.models import no_progress_bars

    dtype = DTYPES[request.dtype]
    device = devices.resolve(request.options.device)
    on_gpu = device != "cpu"
    if request.options.threads:
        torch.set_num_threads(request.options.threads)
    if on_gpu and dtype == torch.float32:
        (request.report or _warn)("float32 on a GPU: --dtype bfloat16 (or float16) halves what every forward reads")
    if not on_gpu and dtype != torch.float32 and not has_native_bf16():
        (request.report or _warn)("this CPU has no native bf16 (avx512_bf16 / amx_bf16): bfloat16 runs "
                                  "emulated and is likely slower than float32")
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(request.resolved.hf_dir, dtype=dtype).eval().to(device)
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"could not load model {request.resolved.name} from {request.resolved.hf_dir}: "
                           f"{exc}") from exc
    pad = PAD_ROWS if on_gpu and request.exact is not False else 0
    graphs = on_gpu if request.options.graphs is None else request.options.graphs
    return prepared(model, request.resolved.name, request.tune_kernels, pad, graphs)[0]


def prepared(model, name: str, tune_kernels: bool, pad: int = 0, graphs: bool = False):
    """``model`` ready to run: its :class:`LoadedWeights` (sequences padded to ``pad`` rows, see
    :data:`PAD_ROWS`; with ``graphs``, on a static KV cache with CUDA graphs,
    :mod:`specdec.backends.hf_static`) and, when ``tune_kernels`` applies, the handle of its tuned
    matmul kernels (``.undo()`` restores them; None when untouched)."""
    from specdec import kernels
    from specdec.cpu import machine_tag

    # bf16 kernels are already nearly flat in the row count and the rerouting did not help them
    # (docs: benchmarks), so only fp32 models on a CPU are tuned.
    tune = tune_kernels and model.dtype == torch.float32 and model.device.type == "cpu"
    key = f"{name}-{model.dtype}-{machine_tag()}"
    installed = kernels.install(model, kernels.tuned(model, key)) if tune else None
    kernels_name = "tuned" if tune else f"padded{pad}" if pad else "stock"
    make = lambda: HFBackend(model, pad)  # noqa: E731
    batched = None
    if graphs and pad and model.device.type == "cuda":
        # A server's sequences in one forward of one shape (exact: no answer depends on the batch).
        def batched(slots: int, kv_memory: str | None = None):
            from specdec.backends.hf_batched import paged_batch

            return paged_batch(model, slots, kv_memory)
    if graphs:
        from specdec.backends.hf_static import HFStaticBackend, StaticModel

        shared = StaticModel(model)
        make = lambda: HFStaticBackend(model, pad, shared)  # noqa: E731
        kernels_name += "-graphs" if model.device.type == "cuda" else "-static"
    # Exact only where every forward is padded: the growing cache runs models with sliding layers
    # unpadded (HFBackend), the static cache pads them too.
    exact = bool(pad) and (graphs or not _sliding(model.config))
    words = [str(model.dtype).removeprefix("torch."), "this CPU's tuned matmul kernels" if tune else
             f"every forward padded to {pad} rows" if pad else "stock kernels"]
    if graphs:
        words.append("static KV cache" + (" with CUDA graphs" if model.device.type == "cuda" else ""))
    weights = LoadedWeights(make, f"{model.dtype}-{kernels_name}", model, exact=exact, device=str(model.device),
                            batched=batched, kernels=", ".join((["exact"] if exact else []) + words))
    return weights, installed


def _sliding(config) -> bool:
    types = getattr(config, "layer_types", None) or []
    return bool(getattr(config, "sliding_window", None)) and any("sliding" in str(t) for t in types)


def _warn(message: str) -> None:
    print(f"specdec: warning: {message}", file=sys.stderr, flush=True)
