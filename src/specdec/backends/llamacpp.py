"""The llama.cpp backend (llama-cpp-python's low-level API on the GGUF itself; an optional extra:
``specdec[llamacpp]``): its registration, and its public names.

Its rooms, each importing only the ones before it:

- :mod:`.llamacpp_lib`: the library imported once, logging silenced, every forward;
- :mod:`.llamacpp_kernels`: exact or fast kernels, and the context parameters that choose them;
- :mod:`.llamacpp_prompt`: prompts filled on repacked weights, or from the caches of recent ones;
- :mod:`.llamacpp_weights`: a GGUF loaded once, contexts made on it;
- :mod:`.llamacpp_sequence`: one sequence: chains, trees, rollback (:class:`LlamaCppBackend`);
- :mod:`.llamacpp_batched`: sequences stepped together in one context (``specdec serve``).
"""

from __future__ import annotations

from specdec.backends.llamacpp_batched import SharedSequences
from specdec.backends.llamacpp_kernels import EXACT, FAST, Kernels, choose_kernels
from specdec.backends.llamacpp_lib import AMX_BUFFER, has_llamafile, kernel_generation
from specdec.backends.llamacpp_sequence import LlamaCppBackend
from specdec.backends.llamacpp_weights import LlamaCppWeights, load_llamacpp
from specdec.errors import SpecdecError
from specdec.registry import LoadedWeights, LoadRequest, backend

__all__ = ["EXACT", "FAST", "Kernels", "LlamaCppBackend", "LlamaCppWeights", "SharedSequences",
           "choose_kernels", "has_llamafile", "load_llamacpp"]


@backend("llamacpp", "llama.cpp on the GGUF itself (needs specdec[llamacpp]; several times faster than "
                     "fp32 PyTorch here)", reads_gguf=True, batched=True, order=10)
def _load(request: LoadRequest) -> LoadedWeights:
    gguf = request.resolved.gguf
    if gguf is None:
        raise SpecdecError(f"the llama.cpp backend needs a GGUF file; {request.resolved.name} is a transformers folder")
    weights = load_llamacpp(str(gguf), exact=request.exact, n_ctx=request.options.context,
                            n_threads=request.options.threads)
    forget = weights.prompts.clear if weights.prompts is not None else None
    # The cost curve is measured per kernel setting and library: specdec's multi-row kernels (each
    # generation of them), AMX's tiles and capped micro-batches price rows differently.
    generation = kernel_generation()
    rows = ("-rows" if weights.exact and generation else "") + (f"-gen{generation}" if generation > 1 else "")
    rows += "-amx" if AMX_BUFFER in weights.buffers else ""
    capped = f"-ubatch{weights.n_ubatch}" if weights.n_ubatch < weights.n_batch else ""
    return LoadedWeights(lambda: LlamaCppBackend(weights), f"gguf-{weights.kernels.name}{rows}{capped}",
                         exact=weights.exact, batched=lambda slots: SharedSequences(weights, slots),
                         forget_prompts=forget)
