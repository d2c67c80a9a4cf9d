"""Benchmark methods: ours through :meth:`specdec.Model.generate`, the peers through their own
public APIs (transformers' ``generate``, llama-cpp-python's ``Llama.generate``).

Method strings: ``plain`` and every registered drafter as ``NAME[:ALIAS][:tree][:k=K][:policy=P][:verify=V]``
(``ALIAS`` for drafters that run a model; ``tree`` lets the draft branch), and the peers' ``hf-plain``, ``hf-lookup[:k=K]``,
``hf-assisted:ALIAS``, ``llamacpp-plain``, ``llamacpp-lookup[:k=K]``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec.api import Model, load
from specdec.errors import SpecdecError
from specdec.models import resolve
from specdec.registry import DRAFTERS

PEERS = {"hf-plain": "transformers", "hf-lookup": "transformers", "hf-assisted": "transformers",
         "llamacpp-plain": "llamacpp", "llamacpp-lookup": "llamacpp"}  # method -> the backend it needs
PEER_FORMS = ("hf-plain", "hf-lookup[:k=K]", "hf-assisted:ALIAS", "llamacpp-plain[:exact]",
              "llamacpp-lookup[:exact][:k=K]")
BASELINES = {"ours": "plain", "hf": "hf-plain", "llamacpp": "llamacpp-plain"}
OUR_OPTIONS = ("k", "policy", "verify")
TREE = "tree"  # the flag that lets our draft branch (ngram:tree, model:ALIAS:tree)


def method_forms() -> list[str]:
    """Every method string this build understands (ours from the drafter registry, then the peers')."""
    ours = ["plain"] + [f"{e.name}{':ALIAS' if e.needs_draft_model else ''}[:tree][:k=K][:policy=P][:verify=V]"
                        for e in DRAFTERS if e.name != "none"]
    return ours + list(PEER_FORMS)


@dataclass
class RunResult:
    """One method on one question."""

    token_ids: list[int]
    wall_s: float
    # Ours only: counters for acceptance (None for peers, which do not expose them).
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    draft_steps: int | None = None  # steps that verified at least one draft token
    rejections: int | None = None  # steps where a draft token was rejected
    draft_s: float | None = None
    accepted_per_pos: list[int] | None = None
    drafted_per_pos: list[int] | None = None
    draft_forwards: int | None = None  # draft-model forwards (0 for drafters without a model)
    tree_nodes: int | None = None  # draft nodes verified in steps whose draft branched


@dataclass
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Method(ABC):
    """A way to generate: ``run`` returns the new token ids and the wall time of the call."""

    name: str
    family: str  # "ours", "hf" or "llamacpp": which plain method is its baseline

    @property
    def baseline(self) -> str:
        return BASELINES[self.family]

    @abstractmethod
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int | None) -> RunResult:
        """Generate after ``prompt_ids``; only the generation call itself is timed."""


@dataclass
class OurMethod(Method):
    name: str
    model: Model
    kwargs: dict
    sampling: Sampling
    family: str = "ours"

    def run(self, prompt_ids, max_new_tokens, seed):
        t0 = time.perf_counter()
        out = self.model.generate(prompt_ids, max_new_tokens=max_new_tokens, temperature=self.sampling.temperature,
                                  top_k=self.sampling.top_k, top_p=self.sampling.top_p, seed=seed, **self.kwargs)
        wall = time.perf_counter() - t0
        s = out.stats
        rejections = sum(st.accepted < len(st.drafted) for st in out.trace if st.drafted)
        return RunResult(out.token_ids, wall, s.target_forwards, s.drafted, s.accepted, s.draft_steps,
                         rejections, s.draft_s, s.accepted_per_pos, s.drafted_per_pos, s.draft_forwards,
                         s.tree_nodes)


@dataclass
class HFMethod(Method):
    name: str
    hf_model: object
    eos: list[int]
    pad: int
    extra: dict
    sampling: Sampling
    family: str = "hf"

    def run(self, prompt_ids, max_new_tokens, seed):
        import torch

        ids = torch.tensor([prompt_ids])
        kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                      attention_mask=torch.ones_like(ids), **self.extra)
        if self.sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            if seed is not None:
                torch.manual_seed(seed)
            kwargs.update(do_sample=True, temperature=self.sampling.temperature,
                          top_k=self.sampling.top_k or None, top_p=self.sampling.top_p)
        calls = [0]
        # Counting the target's forwards gives the peers' mean accepted length too (their first
        # forward takes the prompt with the first token's work, so every forward counts).
        hook = self.hf_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.hf_model.generate(ids, **kwargs)
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        return RunResult(out[0, len(prompt_ids):].tolist(), wall, target_forwards=calls[0])


@dataclass
class LlamaMethod(Method):
    name: str
    llama: object
    eos: set[int]
    sampling: Sampling
    family: str = "llamacpp"

    def run(self, prompt_ids, max_new_tokens, seed):
        s = self.sampling
        # A fresh start: Llama.generate would otherwise reuse the KV cache of a shared prefix.
        self.llama.reset()
        if seed is not None:
            self.llama.set_seed(seed)
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in self.llama.generate(prompt_ids, temp=s.temperature, top_k=s.top_k if s.top_k else 40,
                                       top_p=s.top_p, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if tok in self.eos or len(out) >= max_new_tokens:
                break
        wall = time.perf_counter() - t0
        return RunResult(out, wall)


@dataclass
class MethodFactory:
    """Builds methods for one target model, loading each peer model at most once."""

    model: Model
    model_name: str
    backend: str
    dtype: str
    sampling: Sampling
    _cache: dict = field(default_factory=dict)

    def build(self, spec: str) -> Method:
        head, args, options = _split(spec)
        if head == "plain" or head in DRAFTERS:
            return self._ours(spec, head, args, options)
        if head.startswith("hf-"):
            return self._hf(spec, head, args, options)
        if head.startswith("llamacpp-"):
            return self._llamacpp(spec, head, args, options)
        raise _unknown(spec)

    def _ours(self, spec, head, args, options) -> Method:
        entry = DRAFTERS.get("none" if head == "plain" else head)
        kwargs: dict = {"drafter": entry.name}
        _check_ours(spec, entry, args, options)
        if TREE in args:
            kwargs["tree"] = True
            args = [a for a in args if a != TREE]
        if entry.needs_draft_model:
            kwargs["draft_model"] = self._once(("ours", args[0]), lambda: load(args[0], dtype=self.dtype,
                                                                             backend=self.backend,
                                                                             exact=self.model.exact))
        if "k" in options:
            kwargs["num_draft"] = _positive(spec, options["k"])
        for key in ("policy", "verify"):
            if key in options:
                kwargs[key] = options[key]
        return OurMethod(spec, self.model, kwargs, self.sampling)

    def _hf(self, spec, head, args, options) -> Method:
        if self.backend != "transformers":
            raise SpecdecError(f"method {spec!r} runs on --backend transformers (this run is {self.backend})")
        extra: dict = {}
        if head == "hf-lookup":
            extra["prompt_lookup_num_tokens"] = _positive(spec, options.pop("k", "10"))
        elif head == "hf-assisted":
            if len(args) != 1:
                raise SpecdecError(f"method {spec!r}: write hf-assisted:ALIAS")
            extra["assistant_model"] = self._hf_model(args[0])
            from transformers import AutoTokenizer

            assistant = AutoTokenizer.from_pretrained(resolve(args[0]).hf_dir)
            if assistant.get_vocab() != self.model.tokenizer.get_vocab():
                # Universal Assisted Generation (greedy, through text; token intersection when sampling)
                extra.update(tokenizer=self.model.tokenizer, assistant_tokenizer=assistant)
        elif head != "hf-plain":
            raise _unknown(spec)
        _no_more(spec, options)
        tok = self.model.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(self.model.eos_token_ids)[0]
        return HFMethod(spec, self._hf_model(self.model_name), sorted(self.model.eos_token_ids), pad, extra,
                        self.sampling)

    def _hf_model(self, name: str):
        """An untouched transformers model, loaded as a user would (our Model's kernels are rerouted)."""
        def make():
            import torch
            from transformers import AutoModelForCausalLM

            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]
            return AutoModelForCausalLM.from_pretrained(resolve(name).hf_dir, dtype=dtype).eval()

        return self._once(("hf", name), make)

    def _llamacpp(self, spec, head, args, options) -> Method:
        if self.backend != "llamacpp":
            raise SpecdecError(f"method {spec!r} runs on --backend llamacpp (this run is {self.backend})")
        if head not in ("llamacpp-plain", "llamacpp-lookup"):
            raise _unknown(spec)
        import os

        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kwargs = dict(model_path=str(resolve(self.model_name, need_hf=False).gguf), n_ctx=4096,
                      n_threads=os.cpu_count(), verbose=False)
        if args == ["exact"]:
            # As close to our exact kernels as its API allows (it cannot turn weight repacking off).
            from specdec.backends.llamacpp import EXACT

            kwargs.update(flash_attn=True, type_k=EXACT.type_k, type_v=EXACT.type_v)
        elif args:
            raise SpecdecError(f"method {spec!r}: write {head}[:exact]")
        if head == "llamacpp-lookup":
            k = _positive(spec, options.pop("k", "10"))
            # logits_all: without it llama-cpp-python's lookup crashes on prompts over 512 tokens.
            kwargs.update(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k), logits_all=True)
        _no_more(spec, options)
        return LlamaMethod(spec, Llama(**kwargs), set(self.model.eos_token_ids), self.sampling)

    def _once(self, key, make: Callable):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def check_specs(specs: list[str], backend: str) -> None:
    """Refuse malformed methods, and peers of the other backend, before any model is loaded."""
    for spec in specs:
        head, args, options = _split(spec)
        if head == "plain" or head in DRAFTERS:
            _check_ours(spec, DRAFTERS.get("none" if head == "plain" else head), args, options)
        elif head in PEERS:
            if PEERS[head] != backend:
                raise SpecdecError(f"method {spec!r} runs on --backend {PEERS[head]} (this run is {backend})")
        else:
            raise _unknown(spec)


def _check_ours(spec: str, entry, args: list[str], options: dict) -> None:
    from specdec.registry import POLICIES
    from specdec.sampling import VERIFY_MODES

    if TREE in args:
        if entry.name == "none":
            raise SpecdecError(f"method {spec!r}: plain decoding drafts nothing to branch")
        args = [a for a in args if a != TREE]

    if len(args) != int(entry.needs_draft_model):
        raise SpecdecError(f"method {spec!r}: write {entry.name}:ALIAS" if entry.needs_draft_model
                           else f"method {spec!r}: {entry.name} takes no model")
    _no_more(spec, {k: v for k, v in options.items() if k not in OUR_OPTIONS})
    if "k" in options:
        _positive(spec, options["k"])
    if "policy" in options:
        POLICIES.get(options["policy"])
    if options.get("verify", "coupled") not in VERIFY_MODES:
        raise SpecdecError(f"method {spec!r}: verify must be one of {', '.join(VERIFY_MODES)}")


def _split(spec: str) -> tuple[str, list[str], dict[str, str]]:
    parts = [p for p in spec.strip().split(":")]
    if not parts or not parts[0]:
        raise _unknown(spec)
    args = [p for p in parts[1:] if "=" not in p]
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return parts[0], args, options


def _positive(spec: str, value: str) -> int:
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise SpecdecError(f"method {spec!r}: k must be a whole number >= 1")
    return k


def _no_more(spec: str, options: dict) -> None:
    if options:
        raise SpecdecError(f"method {spec!r}: unknown option(s) {', '.join(options)}")


def _unknown(spec: str) -> SpecdecError:
    return SpecdecError(f"unknown method {spec!r}: use {', '.join(method_forms())}")
