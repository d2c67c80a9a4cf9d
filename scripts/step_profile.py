"""Where the time of a decoding step goes on a backend: the model's forward, the logits' copy and
conversion, choosing tokens (verification and sampling), the drafter, the policy, the engine's
bookkeeping and the text, per generated token.

    python scripts/step_profile.py --model gemma3-270m --backend llamacpp --drafter none
    python scripts/step_profile.py --model gemma3-270m --backend llamacpp --drafter ngram --peer

Each part is timed by wrapping the function that does it (the wrappers cost about a microsecond per
call); "engine" is what is left of the step. ``--peer`` also times llama-cpp-python's own
``Llama.generate`` on the same prompts: its forward and everything around it.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path



class Timers:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth: list[str] = []

    def wrap(self, owner, name: str, part: str) -> None:
        """Time ``owner.name`` as ``part`` (time inside nested timed parts is not counted twice)."""
        original = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            timers._depth.append(part)
            try:
                return original(*args, **kwargs)
            finally:
                timers._depth.pop()
                spent = time.perf_counter() - t0
                timers.seconds[part] += spent
                if timers._depth:
                    timers.seconds[timers._depth[-1]] -= spent

        setattr(owner, name, timed)


def prompts(questions: str, limit: int) -> list[str]:
    """The first prompt of each category of a shipped prompt set (or a .jsonl file), cut to 2000
    characters."""
    from specdec.bench.questions import load_questions

    return [q.prompt[:2000] for q in load_questions(questions, None, limit=1)][:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--questions", default="spec-bench", help="a shipped prompt set or a .jsonl file")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--peer", action="store_true", help="also time llama-cpp-python's Llama.generate")
    parser.add_argument("--peer-exact", action="store_true",
                        help="the peer with our exact settings where its API has them (flash attention, q8_0 K)")
    args = parser.parse_args()

    import specdec
    from specdec import engine
    from specdec.backends import llamacpp
    from specdec.backends.llamacpp_lib import lib as llama_lib
    from specdec.drafters.base import Drafter
    from specdec.policies.base import DraftPolicy
    from specdec.text import TextCodec

    model = specdec.load(args.model, backend=args.backend, **({} if args.exact is None else {"exact": args.exact}))
    ids = [model.encode(p, chat=model.has_chat_template) for p in prompts(args.questions, args.prompts)]
    model.generate(ids[0], drafter=args.drafter, max_new_tokens=4)  # calibration, first allocations

    timers = Timers()
    lib = llama_lib()
    timers.wrap(lib, "llama_decode", "forward (llama_decode)")
    timers.wrap(llamacpp.LlamaCppBackend, "_run_batch", "logits copy")
    timers.wrap(llamacpp.LlamaCppBackend, "extend", "checks, conversion to torch")
    timers.wrap(engine, "verify", "choosing tokens (verify, sampling)")
    for cls in {type(model.drafter(args.drafter)), Drafter}:
        for name in ("propose", "see", "observe"):
            if name in vars(cls):
                timers.wrap(cls, name, "drafter")
    for cls in {type(model.policy("adaptive")), DraftPolicy}:
        for name in ("choose", "observe", "max_k"):
            if name in vars(cls):
                timers.wrap(cls, name, "policy")
    timers.wrap(TextCodec, "decode", "text")
    tokens = prefill = 0
    t0 = time.perf_counter()
    for x in ids:
        out = model.generate(x, drafter=args.drafter, max_new_tokens=args.max_new_tokens)
        tokens += out.stats.new_tokens
        prefill += out.stats.prefill_s
    wall = time.perf_counter() - t0 - prefill
    report(f"specdec {args.drafter} ({model.loaded.cost_key})", timers, tokens, wall, prefill)
    if args.peer:
        peer(args, model, ids)


def report(title: str, timers: Timers, tokens: int, wall: float, prefill: float) -> None:
    # The prefill's forwards are counted with the forwards; its wall time is left out of "engine".
    parts = dict(timers.seconds)
    forward = parts.get("forward (llama_decode)", 0.0) - prefill
    parts["forward (llama_decode)"] = forward
    parts["engine (the rest)"] = wall - sum(parts.values())
    print(f"{title}: {tokens} tokens, {tokens / wall:.1f} tokens/s after the prefill")
    for part, seconds in parts.items():
        print(f"  {part:38s} {1e3 * seconds / tokens:7.3f} ms/token")


def peer(args, model, ids) -> None:
    """llama-cpp-python's own generation loop on the same prompts (its default configuration)."""
    import llama_cpp
    import llama_cpp._internals as internals
    from llama_cpp import Llama

    from specdec.cpu import usable_cpus
    from specdec.models import resolve

    from specdec.backends.llamacpp import EXACT

    settings = dict(flash_attn=True, type_k=EXACT.type_k, type_v=EXACT.type_v) if args.peer_exact else {}
    llm = Llama(model_path=str(resolve(args.model, need_hf=False).gguf), n_ctx=4096, n_threads=usable_cpus(),
                verbose=False, **settings)
    eos = set(model.eos_token_ids)
    timers = Timers()
    timers.wrap(internals.llama_cpp, "llama_decode", "forward (llama_decode)")
    tokens = 0
    prefill = 0.0
    t0 = time.perf_counter()
    for x in ids:
        llm.reset()
        start = time.perf_counter()
        for i, tok in enumerate(llm.generate(x, temp=0.0, top_k=40, top_p=1.0, repeat_penalty=1.0, reset=True)):
            if i == 0:
                prefill += time.perf_counter() - start
            tokens += 1
            if tok in eos or i + 1 >= args.max_new_tokens:
                break
    wall = time.perf_counter() - t0 - prefill
    report(f"llama-cpp-python Llama.generate{' (exact settings)' if args.peer_exact else ''}", timers, tokens,
           wall, prefill)
    del llama_cpp


if __name__ == "__main__":
    main()
