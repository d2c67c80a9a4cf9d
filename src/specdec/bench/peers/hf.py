"""transformers as a benchmark peer: ``hf-plain``, ``hf-lookup[:k=K]`` (its prompt lookup, default
10 tokens) and ``hf-assisted:ALIAS`` (assisted generation with a draft model; another tokenizer
goes through Universal Assisted Generation), each through ``generate`` on an untouched model
loaded as a user would load it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from specdec.bench.base import Method, PeerContext, RunResult, no_more, peer, positive
from specdec.errors import SpecdecError
from specdec.models import resolve
from specdec.options import GenerationOptions


@dataclass
class HFMethod(Method):
    name: str
    hf_model: object
    eos: list[int]
    pad: int
    extra: dict
    options: GenerationOptions  # the sampling is read from it
    family: str = "hf"

    def run(self, prompt_ids, max_new_tokens, seed, schema=None):
        import torch

        ids = torch.tensor([prompt_ids], device=self.hf_model.device)
        kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                      attention_mask=torch.ones_like(ids), **self.extra)
        s = self.options
        if s.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            if seed is not None:
                torch.manual_seed(seed)
            kwargs.update(do_sample=True, temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
        calls = [0]
        # Counting the target's forwards gives the peers' mean accepted length too (their first
        # forward takes the prompt with the first token's work, so every forward counts).
        hook = self.hf_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.hf_model.generate(ids, **kwargs)
            tokens = out[0, len(prompt_ids):].tolist()  # on a GPU: waits for the last forward
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        return RunResult(tokens, wall, peer_forwards=calls[0])


def _parse(spec: str, args: list, pairs: dict, target: str | None) -> dict:
    head = spec.split(":", 1)[0]
    extra: dict = {}
    if head == "hf-lookup":
        if args:
            raise SpecdecError(f"method {spec!r}: write hf-lookup[:k=K]")
        extra["prompt_lookup_num_tokens"] = positive(spec, pairs.pop("k", "10"))
    elif head == "hf-assisted":
        if len(args) != 1:
            raise SpecdecError(f"method {spec!r}: write hf-assisted:ALIAS")
        extra["assistant"] = args[0]
    elif args:
        raise SpecdecError(f"method {spec!r}: write {head}")
    no_more(spec, pairs)
    return extra


def _hf_model(context: PeerContext, name: str):
    """An untouched transformers model, loaded as a user would (our Model's kernels are rerouted)."""
    def make():
        import torch
        from transformers import AutoModelForCausalLM

        from specdec.backends.hf import DTYPES

        device = getattr(context.model.loaded, "device", "cpu")  # the bench's target's device
        return AutoModelForCausalLM.from_pretrained(resolve(name).hf_dir, dtype=DTYPES[context.dtype]).eval().to(device)

    return context.once(("hf", name), make)


def _build(context: PeerContext, spec: str, settings: dict) -> Method:
    extra = dict(settings)
    assistant = extra.pop("assistant", None)
    tok = context.model.tokenizer
    if assistant is not None:
        from transformers import AutoTokenizer

        extra["assistant_model"] = _hf_model(context, assistant)
        assistant_tok = AutoTokenizer.from_pretrained(resolve(assistant).hf_dir)
        if assistant_tok.get_vocab() != tok.get_vocab():
            # Universal Assisted Generation (greedy, through text; token intersection when sampling)
            extra.update(tokenizer=tok, assistant_tokenizer=assistant_tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(context.model.eos_token_ids)[0]
    return HFMethod(spec, _hf_model(context, context.model_name), sorted(context.model.eos_token_ids), pad, extra,
                    context.options)


peer("hf-plain", "hf-plain", "hf", parse=_parse, backend="transformers", baseline=True, order=10)(_build)
peer("hf-lookup", "hf-lookup[:k=K]", "hf", parse=_parse, backend="transformers", order=11)(_build)
peer("hf-assisted", "hf-assisted:ALIAS", "hf", parse=_parse, backend="transformers", order=12)(_build)
