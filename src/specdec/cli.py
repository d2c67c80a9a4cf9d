"""``specdec generate | bench``: the command line. Bad input ends with one ``error: ...`` line on
stderr and a non-zero exit, never a traceback (set SPECDEC_DEBUG=1 to see one for internal errors)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from specdec.errors import SpecdecError

EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage plus a prefixed line
        raise SpecdecError(message)


def build_parser() -> argparse.ArgumentParser:
    from specdec.api import BACKENDS, DRAFTERS, DTYPES, POLICIES
    from specdec.models import ALIASES, DEFAULT_MODEL

    parser = _Parser(prog="specdec", description="Lossless speculative decoding for LLM generation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         description="Generate text; greedy output equals plain decoding exactly.")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--model", default=DEFAULT_MODEL,
                     help=f"alias ({', '.join(ALIASES)}), a .gguf file or a transformers folder "
                          f"(default: {DEFAULT_MODEL})")
    gen.add_argument("--drafter", default="ngram", choices=DRAFTERS,
                     help="none: plain decoding; ngram: prompt lookup; model: --draft-model (default: ngram)")
    gen.add_argument("--draft-model", help="the drafter model for --drafter model (same tokenizer)")
    gen.add_argument("--num-draft", type=int, default=None, metavar="K",
                     help="draft tokens per step: the most with --policy adaptive (default 12), "
                          "exactly K with --policy fixed (default 4)")
    gen.add_argument("--policy", default="adaptive", choices=POLICIES,
                     help="adaptive: verify only what pays on this machine's cost curve; fixed: always K "
                          "(default: adaptive)")
    gen.add_argument("--backend", default="transformers", choices=BACKENDS,
                     help="model runtime (default: transformers; llamacpp needs specdec[llamacpp])")
    gen.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="default: 128")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off (default)")
    gen.add_argument("--seed", type=int, default=None, help="seed for sampling")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop when this text appears (repeatable; not included in the output)")
    gen.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights dtype (default: float32)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--compare", action="store_true",
                     help="also run plain decoding and report the speed-up (and, greedy, whether tokens match)")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")

    from specdec.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def check_generate_args(args: argparse.Namespace) -> None:
    """Reject bad input before any model is loaded, so errors come in milliseconds."""
    from specdec.sampling import SamplingParams

    if not args.prompt.strip():
        raise SpecdecError("the prompt is empty")
    if args.num_draft is not None and args.num_draft < 1:
        raise SpecdecError(f"--num-draft must be >= 1, got {args.num_draft}")
    if args.max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)  # validates the ranges
    if args.drafter == "model" and not args.draft_model:
        raise SpecdecError("--drafter model needs --draft-model")
    if args.draft_model and args.drafter != "model":
        raise SpecdecError("--draft-model is only used with --drafter model")


def cmd_generate(args: argparse.Namespace) -> int:
    check_generate_args(args)
    from specdec.api import load

    _quiet_libraries()
    model = load(args.model, dtype=args.dtype, backend=args.backend)
    draft_model = load(args.draft_model, dtype=args.dtype, backend=args.backend) if args.draft_model else None
    kwargs = dict(max_new_tokens=args.max_new_tokens, drafter=args.drafter, draft_model=draft_model,
                  num_draft=args.num_draft, policy=args.policy, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, stop=args.stop, chat=args.chat)
    prompt_ids = model.encode(args.prompt, chat=args.chat)
    baseline = None
    if args.compare:
        model.generate(prompt_ids, **{**kwargs, "max_new_tokens": 2, "drafter": "none"})  # warm-up
        baseline = model.generate(prompt_ids, **{**kwargs, "drafter": "none"})
    out = model.generate(prompt_ids, **kwargs)
    if args.json:
        result = out.to_dict()
        if baseline is not None:
            result["baseline"] = {"token_ids": baseline.token_ids, "stats": baseline.stats.to_dict()}
            result["speedup"] = _speedup(out, baseline)
        print(json.dumps(result, ensure_ascii=False))
        return 0
    from specdec.report import print_generation

    print_generation(out, baseline, drafter=args.drafter, greedy=args.temperature == 0)
    return 0


def _speedup(out, baseline) -> float:
    return round(baseline.stats.wall_s / out.stats.wall_s, 3) if out.stats.wall_s > 0 else 0.0


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "bench":
            from specdec.bench.cli import cmd_bench

            return cmd_bench(args)
        raise SpecdecError(f"unknown command {args.command}")
    except SpecdecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless asked for more
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with SPECDEC_DEBUG=1 for details",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
