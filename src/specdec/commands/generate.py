"""``specdec generate``: one prompt, its continuation on stdout, metrics on stderr."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.commands.common import (add_generation_options, add_model_options, announce, check_context,
                                     check_positive, generation_options, load_options, quiet_libraries)
from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.api import Output
    from specdec.compare import Comparison
    from specdec.models import ResolvedModel

NAME = "generate"
ORDER = 0
COMPARE_PAIRS = 3  # 6 timed runs: enough pairs for a spread, few enough for a demo


def add_parser(sub) -> None:
    gen = sub.add_parser(NAME, help="generate text from a prompt",
                         description="Generate text; greedy output equals plain decoding exactly, and a seed "
                                     "gives the same sampled text with any drafter. stdout carries exactly the "
                                     "generated text; metrics go to stderr.")
    gen.add_argument("prompt", help="the prompt text")
    add_model_options(gen)
    add_generation_options(gen, max_new_tokens=128)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE",
                       help="the answer is JSON valid against this JSON Schema (a file; greedy output is plain "
                            "constrained decoding's, token for token, with any drafter)")
    shape.add_argument("--regex", metavar="PATTERN", help="the answer matches this regular expression")
    shape.add_argument("--grammar", metavar="FILE", help="the answer follows this grammar (a file: Lark, or GBNF)")
    gen.add_argument("--compare", action="store_true",
                     help="also run plain decoding and report the speed-up with its spread, the counters that "
                          "explain it and whether the tokens match: after a warm-up of each, plain and "
                          "speculative runs alternate over --repeats pairs, each from a cold prompt cache")
    gen.add_argument("--repeats", type=int, default=None, metavar="R",
                     help=f"with --compare: pairs of timed runs (default {COMPARE_PAIRS})")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    gen.add_argument("--live", action="store_true",
                     help="watch the generation in the terminal (stderr): tokens coloured by fate (accepted, "
                          "rejected, correction, bonus) and running counters")
    gen.add_argument("--trace", metavar="FILE",
                     help="save every step: FILE.html is a self-contained page to step through, FILE.json "
                          "the data (render it again with specdec replay)")


def check_args(args: argparse.Namespace) -> None:
    """Reject bad input before any model is loaded, so errors come in milliseconds."""
    from specdec.text import check_prompt

    check_prompt(args.prompt)
    args.options = generation_options(args)
    args.constraint = constraint_of(args)
    if args.repeats is not None and not args.compare:
        raise SpecdecError("--repeats sets how many pairs of runs --compare times: add --compare")
    check_positive(args.repeats, "--repeats")
    if args.trace:
        from specdec.trace import check_path

        check_path(args.trace)


def constraint_of(args: argparse.Namespace):
    """The constraint ``--json-schema``, ``--regex`` or ``--grammar`` asks for (None: none); its
    file read and its form checked (whether it compiles is known once the tokenizer is loaded)."""
    from specdec.constraints import spec_of

    def text(path: str, flag: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecdecError(f"{flag}: cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") \
                from None

    if args.json_schema:
        return spec_of(response_format=text(args.json_schema, "--json-schema"))
    if args.grammar:
        return spec_of(grammar=text(args.grammar, "--grammar"))
    return spec_of(regex=args.regex) if args.regex is not None else None


def check_model_files(args: argparse.Namespace) -> None:
    """Checks that need the models' files (fetched, and converted if the backend needs it) but not
    their weights. ``args.draft_model`` is the alias's default draft model when none was given."""
    from specdec.commands.common import resolve_model

    resolved = resolve_model(args.model, args.backend)
    if args.chat and not resolved.has_chat_template:
        raise SpecdecError(f"model {args.model} has no chat template (it is a base model): drop --chat")
    check_context(resolved, args.max_new_tokens)
    if args.draft_model:
        # An unknown draft model fails here, before the target loads.
        draft = resolve_model(args.draft_model, args.backend)
        check_draft_vocabulary(args.options.drafter, draft, resolved)


def check_draft_vocabulary(drafter: str, draft: ResolvedModel, target: ResolvedModel) -> None:
    from specdec.registry import DRAFTERS
    from specdec.text import different_vocabularies, vocabularies_differ

    if DRAFTERS.get(drafter).same_vocabulary:
        quiet_libraries()  # the comparison may load the two tokenizers
        if vocabularies_differ(draft.tokenizer_dir, target.tokenizer_dir):
            raise SpecdecError(different_vocabularies(draft.name, target.name))


def run(args: argparse.Namespace) -> int:
    check_args(args)
    check_model_files(args)
    from specdec.api import load

    quiet_libraries()
    model = load(args.model, **load_options(args))
    announce(args, model)
    draft_model = load(args.draft_model, **load_options(args)) if args.draft_model else None
    if args.memory:
        model.loaded.enable_memory(args.memory)
    options = args.options
    if args.compare and not options.greedy and options.seed is None:
        from specdec.sampling import random_seed

        # One seed for every run: each draws the same text, so the runs compared did the same work.
        options = options.with_(seed=random_seed())
    kwargs = dict(options=options, draft_model=draft_model, chat=args.chat, constraint=args.constraint)
    prompt_ids = model.encode(args.prompt, chat=args.chat)
    reset = start_state(model, draft_model, args.memory) if args.compare else None
    out = records = None
    if args.live:
        out, records = watched(model, draft_model, prompt_ids, kwargs)
    elif args.trace or not args.compare:
        out = model.generate(prompt_ids, **kwargs, trace=bool(args.trace))
    measured = None
    if args.compare:
        # Timed runs carry no trace (recording p and q costs time) and no live view.
        measured = measure(model, prompt_ids, kwargs, args.repeats or COMPARE_PAIRS, reset)
    if args.memory:
        model.loaded.memory.save(args.memory)
    if args.trace:
        from specdec.trace import document
        from specdec.views.files import save

        settings = {k: options[k] for k in ("drafter", "num_draft", "policy", "temperature", "top_k", "top_p",
                                           "verify", "tree", "max_new_tokens")}
        doc = document(out, model, settings=settings, draft_model=draft_model, plain_step_s=plain_step_s(model),
                       records=records)
        if measured is not None:
            doc["measured_speedup"] = round(measured.comparison.speedup, 3)
        save(doc, args.trace)
    shown = out
    baseline = None
    if measured is not None:
        # The stats shown are the timed runs' (the median of each method), never a traced run's.
        out, baseline = measured.spec, measured.plain
    if args.json:
        result = out.to_dict()
        if measured is not None:
            result["baseline"] = {"token_ids": baseline.token_ids, "stats": baseline.stats.to_dict()}
            result.update(measured.to_dict())
        print(json.dumps(result, ensure_ascii=False))
        return 0
    from specdec.report import print_generation

    # The live view already showed the text on a terminal; a pipe or a file still gets exactly the text.
    if not (args.live and sys.stdout.isatty()):
        write_text((shown or out).text)
    print_generation(out, baseline, drafter=options.drafter, greedy=options.greedy,
                     comparison=None if measured is None else measured.comparison,
                     generation=None if measured is None else measured.generation)
    if args.trace:
        print(f"trace written to {args.trace}", file=sys.stderr)
    return 0


def watched(model, draft_model, prompt_ids, kwargs):
    """Generate while the live view draws each step (steps carry p and q, as for a trace); the
    output and the step records the view drew (a trace file reuses them)."""
    from specdec.trace import Detokenizer, own_codec, step_record
    from specdec.views.terminal import LiveView, describe

    run = model.start(prompt_ids, **kwargs, trace=True)
    detok = Detokenizer(model.loaded.codec)
    draft_codec = own_codec(model, draft_model)
    title = describe({"model": model.name, "backend": model.loaded.backend_name, "settings": kwargs["options"].to_dict(),
                      "draft_model": draft_model.name if draft_model is not None else None})
    records = []
    with LiveView(plain_step_s=plain_step_s(model), title=title) as view:
        for step in run:
            records.append(step_record(step, model.loaded.codec, detok.add(step.emitted), draft_codec))
            view.update(records[-1])
    return model.finish(run, run.result, run.options.stop), records


def plain_step_s(model) -> float | None:
    """This machine's cost of a plain decoding step (for the views' speed-up estimate)."""
    try:
        return model.loaded.cost_model().forward(1)
    except Exception:  # an estimate only: a view without it is still right
        return None


def write_text(text: str) -> None:
    """Exactly the generated text on stdout (a newline is added only for a terminal)."""
    sys.stdout.write(text + ("\n" if sys.stdout.isatty() else ""))
    sys.stdout.flush()


@dataclass
class Measured:
    """Plain and speculative decoding timed in alternating pairs (``--compare``)."""

    spec: Output  # the speculative run of median time
    plain: Output  # the plain run of median time
    spec_s: list[float]  # wall time of each timed run, pair by pair
    plain_s: list[float]
    comparison: Comparison  # end to end
    generation: Comparison  # after the target's prompt (the same work in both runs)

    def to_dict(self) -> dict:
        """``speedup``, ``speedup_spread``, ``within_noise``, ``verdict``, ``repeats``,
        ``speedup_ceiling`` and the timings they come from, end to end; ``generation`` the same
        after the target's prompt (as llama.cpp's ``predicted_per_second`` counts)."""
        return {**self.comparison.to_dict(), "generation": self.generation.to_dict(),
                "timings": {"plain_s": [round(t, 4) for t in self.plain_s],
                            "speculative_s": [round(t, 4) for t in self.spec_s]}}


def start_state(model, draft_model, memory: str | None) -> Callable[[], None]:
    """A function that puts the models back in the state they are in now, before a timed run.

    Every run then starts alike: no cached prompt (cold, as a fresh process), no acceptance
    statistics or recycled tables learned from an earlier run of this very prompt (a second pass
    would draft its own answer), and the n-gram memory as the file left it (a drafter adds its
    output to the memory when it finishes)."""
    from specdec.bench.runner import snapshot

    models = [m.loaded for m in (model, draft_model) if m is not None]
    learned = [snapshot(m.learned) for m in models]

    def reset() -> None:
        for m, state in zip(models, learned):
            m.learned = snapshot(state)
            m.forget_prompts()
        if memory:
            model.loaded.enable_memory(memory)

    return reset


def measure(model, prompt_ids: list[int], kwargs: dict, pairs: int, reset: Callable[[], None]) -> Measured:
    """Time plain and speculative decoding on the same prompt: one short warm-up of each (kernels,
    graph shapes, a first cost measurement), then ``pairs`` pairs in alternating order (plain,
    speculative; speculative, plain; ...) so that drift and run order weigh on both alike, each run
    from :func:`start_state`'s state."""
    from specdec.compare import compare, forward_ceiling

    spec_options = kwargs["options"]
    plain_options = spec_options.with_(drafter="none")
    for opts in (plain_options, spec_options):
        reset()
        model.generate(prompt_ids, **{**kwargs, "options": opts.with_(max_new_tokens=min(8, opts.max_new_tokens))})
    runs: dict[str, list[tuple[Output, float]]] = {"plain": [], "spec": []}
    for i in range(pairs):
        for which in (("plain", "spec") if i % 2 == 0 else ("spec", "plain")):
            reset()
            opts = plain_options if which == "plain" else spec_options
            t0 = time.perf_counter()
            out = model.generate(prompt_ids, **{**kwargs, "options": opts})
            runs[which].append((out, time.perf_counter() - t0))
    plain_s, spec_s = [t for _, t in runs["plain"]], [t for _, t in runs["spec"]]
    # After the target's prompt: both runs compute the same prompt, so this is where drafting shows
    # (a draft model's own prompt is part of drafting, and counts here).
    plain_gen = [t - out.stats.prefill_s for out, t in runs["plain"]]
    spec_gen = [t - out.stats.prefill_s for out, t in runs["spec"]]
    plain, spec = _median_run(runs["plain"]), _median_run(runs["spec"])
    ceiling = forward_ceiling(plain.stats.new_tokens, plain.stats.target_forwards,
                              spec.stats.new_tokens, spec.stats.target_forwards)
    return Measured(spec, plain, spec_s, plain_s, compare(plain_s, spec_s, ceiling),
                    compare(plain_gen, spec_gen, ceiling))


def _median_run(runs: list[tuple[Output, float]]) -> Output:
    ranked = sorted(runs, key=lambda r: r[1])
    return ranked[(len(ranked) - 1) // 2][0]
