"""``specdec generate``: one prompt, its continuation on stdout, metrics on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from specdec.commands.common import (add_generation_options, add_model_options, check_context, generation_options,
                                     load_options, quiet_libraries)
from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.models import ResolvedModel

NAME = "generate"
ORDER = 0


def add_parser(sub) -> None:
    gen = sub.add_parser(NAME, help="generate text from a prompt",
                         description="Generate text; greedy output equals plain decoding exactly, and a seed "
                                     "gives the same sampled text with any drafter. stdout carries exactly the "
                                     "generated text; metrics go to stderr.")
    gen.add_argument("prompt", help="the prompt text")
    add_model_options(gen)
    add_generation_options(gen, max_new_tokens=128)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--compare", action="store_true",
                     help="also run plain decoding and report the speed-up (and whether the tokens match)")
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
    if args.trace:
        from specdec.trace import check_path

        check_path(args.trace)


def check_model_files(args: argparse.Namespace) -> None:
    """Checks that need the models' files (fetched and converted if needed) but not their weights."""
    from specdec.models import resolve

    resolved = resolve(args.model)
    if args.chat and not resolved.has_chat_template:
        raise SpecdecError(f"model {args.model} has no chat template (it is a base model): drop --chat")
    check_context(resolved, args.max_new_tokens)
    if args.draft_model:
        draft = resolve(args.draft_model)  # an unknown draft model fails before the target loads
        check_draft_vocabulary(args.options.drafter, draft, resolved)


def check_draft_vocabulary(drafter: str, draft: ResolvedModel, target: ResolvedModel) -> None:
    from specdec.registry import DRAFTERS
    from specdec.text import different_vocabularies, vocabularies_differ

    if DRAFTERS.get(drafter).same_vocabulary:
        quiet_libraries()  # the comparison may load the two tokenizers
        if vocabularies_differ(draft.hf_dir, target.hf_dir):
            raise SpecdecError(different_vocabularies(draft.name, target.name))


def run(args: argparse.Namespace) -> int:
    check_args(args)
    check_model_files(args)
    from specdec.api import load

    quiet_libraries()
    model = load(args.model, **load_options(args))
    draft_model = load(args.draft_model, **load_options(args)) if args.draft_model else None
    if args.memory:
        model.enable_memory(args.memory)
    options = args.options
    kwargs = dict(options=options, draft_model=draft_model, chat=args.chat)
    prompt_ids = model.encode(args.prompt, chat=args.chat)
    baseline = None
    if args.compare:
        model.generate(prompt_ids, **{**kwargs, "options": options.with_(max_new_tokens=2, drafter="none")})  # warm-up
        baseline = model.generate(prompt_ids, **{**kwargs, "options": options.with_(drafter="none")})
    records = None
    if args.live:
        out, records = watched(model, draft_model, prompt_ids, kwargs)
    else:
        out = model.generate(prompt_ids, **kwargs, trace=bool(args.trace))
    if args.memory:
        model.memory.save(args.memory)
    if args.trace:
        from specdec.trace import document
        from specdec.views.files import save

        settings = {k: options[k] for k in ("drafter", "num_draft", "policy", "temperature", "top_k", "top_p",
                                           "verify", "tree", "max_new_tokens")}
        doc = document(out, model, settings=settings, draft_model=draft_model, plain_step_s=plain_step_s(model),
                       records=records)
        if baseline is not None:
            doc["measured_speedup"] = speedup(out, baseline)
        save(doc, args.trace)
    if args.json:
        result = out.to_dict()
        if baseline is not None:
            result["baseline"] = {"token_ids": baseline.token_ids, "stats": baseline.stats.to_dict()}
            result["speedup"] = speedup(out, baseline)
        print(json.dumps(result, ensure_ascii=False))
        return 0
    from specdec.report import print_generation

    # The live view already showed the text on a terminal; a pipe or a file still gets exactly the text.
    if not (args.live and sys.stdout.isatty()):
        write_text(out.text)
    print_generation(out, baseline, drafter=options.drafter, greedy=options.greedy)
    if args.trace:
        print(f"trace written to {args.trace}", file=sys.stderr)
    return 0


def watched(model, draft_model, prompt_ids, kwargs):
    """Generate while the live view draws each step (steps carry p and q, as for a trace); the
    output and the step records the view drew (a trace file reuses them)."""
    from specdec.trace import Detokenizer, own_codec, step_record
    from specdec.views.terminal import LiveView, describe

    run = model.start(prompt_ids, **kwargs, trace=True)
    detok = Detokenizer(model.codec)
    draft_codec = own_codec(model, draft_model)
    title = describe({"model": model.name, "backend": model.backend_name, "settings": kwargs["options"].to_dict(),
                      "draft_model": draft_model.name if draft_model is not None else None})
    records = []
    with LiveView(plain_step_s=plain_step_s(model), title=title) as view:
        for step in run:
            records.append(step_record(step, model.codec, detok.add(step.emitted), draft_codec))
            view.update(records[-1])
    return model.finish(run, run.result, run.options.stop), records


def plain_step_s(model) -> float | None:
    """This machine's cost of a plain decoding step (for the views' speed-up estimate)."""
    try:
        return model.cost_model().forward(1)
    except Exception:  # an estimate only: a view without it is still right
        return None


def write_text(text: str) -> None:
    """Exactly the generated text on stdout (a newline is added only for a terminal)."""
    sys.stdout.write(text + ("\n" if sys.stdout.isatty() else ""))
    sys.stdout.flush()


def speedup(out, baseline) -> float:
    return round(baseline.stats.wall_s / out.stats.wall_s, 3) if out.stats.wall_s > 0 else 0.0
