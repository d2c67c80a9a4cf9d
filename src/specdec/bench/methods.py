"""Benchmark methods: ours through :meth:`specdec.Model.generate`, the peers through their own
public APIs (transformers' ``generate``, llama-cpp-python's ``Llama.generate``).

Method strings: ``plain`` and every registered drafter as
``NAME[:ALIAS][:k=K][:policy=P][:tree][:verify=V][:OPTION=VALUE]`` (``ALIAS`` for drafters that run a
model). Everything after the name is a generation option (:mod:`specdec.options`; ``k`` is
``num_draft``, a bare boolean option's name such as ``tree`` turns it on), so an option a drafter
declares in its own file works here unchanged; the sampling comes from the bench's flags, the same
for every method. The peers: ``hf-plain``, ``hf-lookup[:k=K]``, ``hf-assisted:ALIAS``,
``llamacpp-plain[:exact]``, ``llamacpp-lookup[:exact][:k=K]``, vLLM's (:mod:`specdec.bench.vllm_peer`)
and llama.cpp's own server's ``llama-server-*`` (:mod:`specdec.bench.llama_server_peer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec import option_forms
from specdec.api import Model, load
from specdec.errors import SpecdecError
from specdec.models import resolve
from specdec.options import GenerationOptions, Option, generation_options
from specdec.registry import DRAFTERS
from specdec.bench.base import BASELINES, Method, RunResult  # noqa: F401  (re-exported: the bench's names)

# method -> the backend our run must use (None: any; vLLM loads the model's transformers folder
# itself, llama-server its GGUF)
LLAMA_SERVER = ("llama-server-plain", "llama-server-draft", "llama-server-ngram-simple",
                "llama-server-ngram-map-k", "llama-server-ngram-map-k4v", "llama-server-ngram-mod",
                "llama-server-ngram-cache")
PEERS = {"hf-plain": "transformers", "hf-lookup": "transformers", "hf-assisted": "transformers",
         "llamacpp-plain": "llamacpp", "llamacpp-lookup": "llamacpp", "vllm-plain": None, "vllm-ngram": None,
         **dict.fromkeys(LLAMA_SERVER)}
PEER_FORMS = ("hf-plain", "hf-lookup[:k=K]", "hf-assisted:ALIAS", "llamacpp-plain[:exact]",
              "llamacpp-lookup[:exact][:k=K]", "vllm-plain", "vllm-ngram[:k=K]", "llama-server-plain",
              "llama-server-draft[:ALIAS][:n=N]", "llama-server-ngram-simple[:n=N]",
              "llama-server-ngram-map-k[:n=N]", "llama-server-ngram-map-k4v[:n=N]",
              "llama-server-ngram-mod[:n=N]", "llama-server-ngram-cache")

def method_forms() -> list[str]:
    """Every method string this build understands (ours from the drafter registry and the option
    specs, a drafter's own options on its form, then the peers')."""
    core = [o for o in _spec_options() if o.owner is None]
    ours = ["plain"]
    for entry in DRAFTERS:
        if entry.name == "none":
            continue
        own = [o for o in entry.options if o.bench and o.scope == "generation"]
        ours.append(entry.name + (":ALIAS" if entry.needs_draft_model else "")
                    + "".join(_form(o) for o in core + own))
    return ours + list(PEER_FORMS)


def _spec_options() -> list[Option]:
    return [o for o in generation_options() if o.bench]


def _form(option: Option) -> str:
    key = option.bench_key or option.name
    if option.type is bool:
        return f"[:{key}]"
    return f"[:{key}={option.metavar or key[0].upper()}]"


@dataclass
class OurMethod(Method):
    name: str
    model: Model
    options: GenerationOptions  # validated; max_new_tokens and seed are set per question
    draft_model: Model | None = None
    family: str = "ours"

    def run(self, prompt_ids, max_new_tokens, seed):
        options = self.options.with_(max_new_tokens=max_new_tokens, seed=seed)
        # Cold, like the peers (whose caches are reset): another method's run of the same question
        # must not leave this one its prompt.
        for model in (self.model, self.draft_model):
            if model is not None:
                model.forget_prompts()
        t0 = time.perf_counter()
        out = self.model.generate(prompt_ids, options=options, draft_model=self.draft_model)
        wall = time.perf_counter() - t0
        return RunResult(out.token_ids, wall, stats=out.stats, gen_s=out.stats.wall_s - out.stats.prefill_s,
                         gen_tokens=len(out.token_ids))


@dataclass
class HFMethod(Method):
    name: str
    hf_model: object
    eos: list[int]
    pad: int
    extra: dict
    options: GenerationOptions  # the sampling is read from it
    family: str = "hf"

    def run(self, prompt_ids, max_new_tokens, seed):
        import torch

        ids = torch.tensor([prompt_ids])
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
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        return RunResult(out[0, len(prompt_ids):].tolist(), wall, peer_forwards=calls[0])


@dataclass
class LlamaMethod(Method):
    name: str
    llama: object
    eos: set[int]
    options: GenerationOptions  # the sampling is read from it
    family: str = "llamacpp"

    def run(self, prompt_ids, max_new_tokens, seed):
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


@dataclass
class VllmMethod(Method):
    """vLLM on CPU (fp32) in a worker process of its own environment (:mod:`specdec.bench.vllm_peer`)."""

    name: str
    worker: object  # specdec.bench.vllm_peer.VllmWorker
    options: GenerationOptions
    family: str = "vllm"

    def run(self, prompt_ids, max_new_tokens, seed):
        s = self.options
        answer = self.worker.generate({"prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens,
                                       "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                                       "seed": seed})
        return RunResult(answer["token_ids"], answer["wall_s"])


@dataclass
class MethodFactory:
    """Builds methods for one target model, loading each peer model at most once.

    ``options`` are the bench's (its sampling flags); each of our methods adds what its spec chose.
    """

    model: Model
    model_name: str
    backend: str
    dtype: str
    options: GenerationOptions
    _cache: dict = field(default_factory=dict)

    def build(self, spec: str) -> Method:
        head, args, pairs = _split(spec)
        if head == "plain" or head in DRAFTERS:
            return self._ours(spec)
        if head.startswith("hf-"):
            return self._hf(spec, head, args, pairs)
        if head.startswith("llamacpp-"):
            return self._llamacpp(spec, head, args, pairs)
        if head.startswith("llama-server-"):
            from specdec.bench import llama_server_peer as llama_server

            settings = llama_server.parse(spec, head, args, pairs, self.model_name)
            server = self._once(("llama-server", settings),
                                lambda: llama_server.server_for(self.model_name, settings))
            return llama_server.LlamaServerMethod(spec, server, self.options)
        if head.startswith("vllm-"):
            from specdec.bench import vllm_peer as vllm

            settings = vllm.parse(spec, head, args, pairs)
            worker = self._once(("vllm", settings.ngram),
                                lambda: vllm.VllmWorker(resolve(self.model_name).hf_dir, settings.ngram))
            return VllmMethod(spec, worker, self.options)
        raise _unknown(spec)

    def _ours(self, spec: str) -> Method:
        options, alias = our_options(spec, self.options)  # the loaded model knows its default draft model
        draft_model = None
        if alias is not None:
            draft_model = self._once(("ours", alias), lambda: load(alias, dtype=self.dtype,
                                                                   backend=self.backend, exact=self.model.exact))
        elif DRAFTERS.get(options.drafter).needs_draft_model:  # no ALIAS: the target's default draft model
            draft_model = self.model.default_draft_model()
            if draft_model is None:
                raise SpecdecError(f"method {spec!r}: write {options.drafter}:ALIAS ({self.model.name} names no "
                                   "default draft model)")
        return OurMethod(spec, self.model, options, draft_model)

    def _hf(self, spec, head, args, pairs) -> Method:
        if self.backend != "transformers":
            raise SpecdecError(f"method {spec!r} runs on --backend transformers (this run is {self.backend})")
        extra: dict = {}
        if head == "hf-lookup":
            extra["prompt_lookup_num_tokens"] = _positive(spec, pairs.pop("k", "10"))
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
        _no_more(spec, pairs)
        tok = self.model.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(self.model.eos_token_ids)[0]
        return HFMethod(spec, self._hf_model(self.model_name), sorted(self.model.eos_token_ids), pad, extra,
                        self.options)

    def _hf_model(self, name: str):
        """An untouched transformers model, loaded as a user would (our Model's kernels are rerouted)."""
        def make():
            import torch
            from transformers import AutoModelForCausalLM

            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]
            return AutoModelForCausalLM.from_pretrained(resolve(name).hf_dir, dtype=dtype).eval()

        return self._once(("hf", name), make)

    def _llamacpp(self, spec, head, args, pairs) -> Method:
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
            # Our exact kernels' KV types; its API cannot cap decoding at a few rows a micro-batch
            # without capping its prompt's too, so its plain decoding keeps one-row kernels anyway.
            from specdec.backends.llamacpp_kernels import EXACT

            kwargs.update(flash_attn=True, type_k=EXACT.type_k, type_v=EXACT.type_v)
        elif args:
            raise SpecdecError(f"method {spec!r}: write {head}[:exact]")
        if head == "llamacpp-lookup":
            k = _positive(spec, pairs.pop("k", "10"))
            # logits_all: without it llama-cpp-python's lookup crashes on prompts over 512 tokens.
            kwargs.update(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k), logits_all=True)
        _no_more(spec, pairs)
        return LlamaMethod(spec, Llama(**kwargs), set(self.model.eos_token_ids), self.options)

    def _once(self, key, make: Callable):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def our_options(spec: str, base: GenerationOptions,
                target: str | None = None) -> tuple[GenerationOptions, str | None]:
    """The validated options one of our method strings chose over ``base``, and its draft model's
    alias (None for drafters without a model, or when the target's default draft model is meant:
    refused here when ``target`` is known to have none). Mistakes read ``method 'SPEC': ...``."""
    from specdec.models import default_draft_model

    head, args, pairs = _split(spec)
    entry = DRAFTERS.get("none" if head == "plain" else head)
    switches = {o.bench_key or o.name: o for o in _spec_options() if o.type is bool}
    words = [a for a in args if a not in switches]
    values = {a: "true" for a in args if a in switches} | pairs
    if len(words) > int(entry.needs_draft_model) or (
            entry.needs_draft_model and not words and target is not None and default_draft_model(target) is None):
        raise SpecdecError(f"method {spec!r}: write {entry.name}:ALIAS" if entry.needs_draft_model
                           else f"method {spec!r}: {entry.name} takes no model")
    try:
        options = option_forms.from_spec(values, base.with_(drafter=entry.name))
    except SpecdecError as exc:
        raise SpecdecError(f"method {spec!r}: {exc}") from None
    if entry.name == "none" and options.tree:
        raise SpecdecError(f"method {spec!r}: plain decoding drafts nothing to branch")
    return options, (words[0] if words else None)


def check_specs(specs: list[str], backend: str, base: GenerationOptions, model: str | None = None) -> None:
    """Refuse malformed methods, and peers of the other backend, before any model is loaded
    (with ``model``, also a drafter without ``:ALIAS`` on a target with no default draft model)."""
    for spec in specs:
        head, args, pairs = _split(spec)
        if head == "plain" or head in DRAFTERS:
            our_options(spec, base, model)
        elif head.startswith("llama-server-"):
            from specdec.bench import llama_server_peer as llama_server

            llama_server.parse(spec, head, args, pairs, model)
            llama_server.binary()
        elif head in PEERS:
            if head.startswith("vllm-"):
                from specdec.bench import vllm_peer as vllm

                vllm.parse(spec, head, args, pairs)
                vllm.vllm_python()
            elif PEERS[head] != backend:
                raise SpecdecError(f"method {spec!r} runs on --backend {PEERS[head]} (this run is {backend})")
        else:
            raise _unknown(spec)


def _split(spec: str) -> tuple[str, list[str], dict[str, str]]:
    parts = [p for p in spec.strip().split(":")]
    if not parts or not parts[0]:
        raise _unknown(spec)
    args = [p for p in parts[1:] if "=" not in p]
    pairs = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return parts[0], args, pairs


def _positive(spec: str, value: str) -> int:
    """A peer's ``k`` (its own library's parameter, not one of our options)."""
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise SpecdecError(f"method {spec!r}: k must be a whole number >= 1")
    return k


def _no_more(spec: str, pairs: dict) -> None:
    if pairs:
        raise SpecdecError(f"method {spec!r}: unknown option(s) {', '.join(pairs)}")


def _unknown(spec: str) -> SpecdecError:
    return SpecdecError(f"unknown method {spec!r}: use {', '.join(method_forms())}")
