"""llama-cpp-python as a benchmark peer: ``llamacpp-plain[:exact]`` and ``llamacpp-lookup[:exact][:k=K]``
(its prompt lookup, default 10 tokens), through ``Llama.generate`` on the same GGUF. ``exact``
gives it our exact kernels' KV types (its API cannot cap a micro-batch's rows without capping its
prompt's too)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from specdec.bench.base import Method, PeerContext, RunResult, no_more, peer, positive
from specdec.cpu import usable_cpus
from specdec.errors import SpecdecError
from specdec.models import resolve
from specdec.options import GenerationOptions


@dataclass
class LlamaMethod(Method):
    name: str
    llama: object
    eos: set[int]
    options: GenerationOptions  # the sampling is read from it
    family: str = "llamacpp"

    def run(self, prompt_ids, max_new_tokens, seed, schema=None):
        s = self.options
        # A fresh start: Llama.generate would otherwise reuse the KV cache of a shared prefix.
        self.llama.reset()
        if seed is not None:
            self.llama.set_seed(seed)
        out: list[int] = []
        t0 = t_first = time.perf_counter()
        # Our sampling, like for like: top_k 0 is no top-k cut (llama.cpp skips k <= 0) and no min-p
        # (its default 0.05 would cut the tail). Its chain applies top-p before the temperature, ours
        # after: the same only when top_p is 1 or the temperature 1.
        for tok in self.llama.generate(prompt_ids, temp=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                       min_p=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if len(out) == 1:
                t_first = time.perf_counter()  # the prompt is done: llama.cpp's generation time starts
            if tok in self.eos or len(out) >= max_new_tokens:
                break
        t_end = time.perf_counter()
        return RunResult(out, t_end - t0, gen_s=t_end - t_first, gen_tokens=max(0, len(out) - 1))


def _parse(spec: str, args: list, pairs: dict, target: str | None) -> dict:
    head = spec.split(":", 1)[0]
    if args not in ([], ["exact"]):
        raise SpecdecError(f"method {spec!r}: write {head}[:exact]" + ("[:k=K]" if head == "llamacpp-lookup" else ""))
    settings = {"exact": bool(args)}
    if head == "llamacpp-lookup":
        settings["k"] = positive(spec, pairs.pop("k", "10"))
    no_more(spec, pairs)
    return settings


def _build(context: PeerContext, spec: str, settings: dict) -> Method:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    kwargs = dict(model_path=str(resolve(context.model_name, need_hf=False).gguf), n_ctx=4096,
                  n_threads=usable_cpus(), verbose=False)
    if settings["exact"]:
        from specdec.backends.llamacpp_kernels import EXACT

        kwargs.update(flash_attn=True, type_k=EXACT.type_k, type_v=EXACT.type_v)
    if "k" in settings:
        # logits_all: without it llama-cpp-python's lookup crashes on prompts over 512 tokens.
        kwargs.update(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=settings["k"]), logits_all=True)
    return LlamaMethod(spec, Llama(**kwargs), set(context.model.eos_token_ids), context.options)


peer("llamacpp-plain", "llamacpp-plain[:exact]", "llamacpp", parse=_parse, backend="llamacpp", baseline=True,
     order=20)(_build)
peer("llamacpp-lookup", "llamacpp-lookup[:exact][:k=K]", "llamacpp", parse=_parse, backend="llamacpp",
     order=21)(_build)
