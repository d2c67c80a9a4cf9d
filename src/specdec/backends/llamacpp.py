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
                     "fp32 PyTorch here)", reads_gguf=True, batched=True, order=10, title="llama.cpp")
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
                         forget_prompts=forget, kernels=kernels_in_words(weights, generation))


def kernels_in_words(weights: LlamaCppWeights, generation: int) -> str:
    """What computes ``weights``' logits, for the line a load prints: exact or fast kernels, specdec's
    patched multi-row kernels (``generation`` > 0: :func:`kernel_generation`) or the stock
    library's, and the rows a micro-batch may hold where the self-test or the library caps them."""
    if not weights.exact:
        return "fast kernels, not batch-invariant: speculation may part from plain decoding at a near-tie"
    words = "exact, " + ("patched multi-row kernels" if generation else "stock llama.cpp kernels")
    if weights.n_ubatch < weights.n_batch:
        words += f", at most {weights.n_ubatch} row{'s' if weights.n_ubatch != 1 else ''} a micro-batch"
    return words
