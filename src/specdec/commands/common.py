"""What the subcommands share: the parser that turns argparse errors into one ``error:`` line,
the option groups for model, sampling and drafting, and their checks, which run before any
model is loaded so that bad input is refused in milliseconds."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.models import ResolvedModel


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage plus a prefixed line
        raise SpecdecError(message)


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()


def add_model_options(parser: argparse.ArgumentParser) -> None:
    from specdec.models import ALIASES, DEFAULT_MODEL
    from specdec.registry import BACKENDS

    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"alias ({', '.join(ALIASES)}), a .gguf file or a transformers folder "
                             f"(default: {DEFAULT_MODEL})")
    parser.add_argument("--backend", default="transformers", choices=BACKENDS.names(),
                        help="; ".join(f"{e.name}: {e.help}" for e in BACKENDS) + " (default: transformers)")
    dtypes = sorted({d for e in BACKENDS for d in e.dtypes})
    parser.add_argument("--dtype", default="float32", choices=dtypes, help="weights dtype (default: float32)")
    parser.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                        help="batch-invariant kernels, so speculative output equals plain decoding's token for "
                             "token even at near-ties (llama.cpp: on by default where its build allows it; "
                             "--no-exact runs its fastest kernels)")


def load_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`specdec.load` that the model options chose."""
    return dict(dtype=args.dtype, backend=args.backend, exact=args.exact)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off (default)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for sampling (0..2**64-1): the same seed gives the same text with any drafter")


def add_drafting_options(parser: argparse.ArgumentParser) -> None:
    from specdec.registry import DRAFTERS, POLICIES
    from specdec.sampling import VERIFY_MODES

    parser.add_argument("--drafter", default="ngram", choices=DRAFTERS.names(),
                        help="; ".join(f"{e.name}: {e.help}" for e in DRAFTERS) + " (default: ngram)")
    parser.add_argument("--draft-model", help="the drafter's model, for drafters that use one")
    parser.add_argument("--num-draft", type=int, default=None, metavar="K",
                        help="draft tokens per step: the most with --policy adaptive, exactly K with --policy fixed")
    parser.add_argument("--tree", action="store_true",
                        help="let the draft branch (verified in one target forward with a tree attention mask); "
                             "--num-draft then bounds its number of nodes")
    parser.add_argument("--memory", metavar="FILE",
                        help="let the n-gram drafters also draft from earlier outputs kept in FILE (read if it exists, "
                             "written back at the end; bounded)")
    parser.add_argument("--policy", default="adaptive", choices=POLICIES.names(),
                        help="; ".join(f"{e.name}: {e.help}" for e in POLICIES) + " (default: adaptive)")
    parser.add_argument("--verify", default="coupled", choices=VERIFY_MODES,
                        help="how sampled drafts are verified: coupled (default; the drafter shares the target's "
                             "per-position noise, so a seed gives the same text with any drafter) or rejection "
                             "(rejection sampling, min(1, p/q)); both are lossless")


def check_sampling(args: argparse.Namespace) -> None:
    from specdec.sampling import SamplingParams

    SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)  # validates the ranges


def check_drafting(args: argparse.Namespace) -> None:
    from specdec.registry import DRAFTERS, BACKENDS

    if args.num_draft is not None and args.num_draft < 1:
        raise SpecdecError(f"--num-draft must be >= 1, got {args.num_draft}")
    entry = DRAFTERS.get(args.drafter)
    if entry.needs_draft_model and not args.draft_model:
        raise SpecdecError(f"--drafter {args.drafter} needs --draft-model")
    if args.draft_model and not entry.needs_draft_model:
        raise SpecdecError(f"--draft-model is only used with a drafter that runs a model "
                           f"({', '.join(e.name for e in DRAFTERS if e.needs_draft_model)})")
    if args.memory is not None:
        from pathlib import Path

        if Path(args.memory).is_dir() or not Path(args.memory).parent.is_dir():
            raise SpecdecError(f"--memory needs a file in an existing folder, got {args.memory!r}")
    if args.dtype not in BACKENDS.get(args.backend).dtypes:
        raise SpecdecError(f"--dtype {args.dtype} is not available on the {args.backend} backend")


def check_positive(value: int, flag: str) -> None:
    if value is not None and value < 1:
        raise SpecdecError(f"{flag} must be >= 1, got {value}")


def check_context(resolved: ResolvedModel, max_new_tokens: int) -> None:
    """Refuse a --max-new-tokens that no prompt could fit beside, from the model folder's config.json.

    Loading the weights takes seconds and the engine would refuse the request anyway (every prompt
    has at least one token); prompts that are merely too long are caught there.
    """
    limit = context_length(resolved.hf_dir)
    if limit is not None and max_new_tokens >= limit:
        raise SpecdecError(f"--max-new-tokens {max_new_tokens} does not fit the context of {resolved.name} "
                           f"({limit} tokens, prompt included): ask for at most {limit - 1}")


def context_length(hf_dir: Path) -> int | None:
    """``max_position_embeddings`` from a transformers folder's config.json (None if not stated)."""
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        return None  # loading the model will report what is wrong with the folder
    # Multimodal checkpoints (e.g. Gemma 3 with vision) keep the language model's limit in text_config.
    for section in (config, config.get("text_config")):
        limit = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return limit
    return None
