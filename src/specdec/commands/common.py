"""What the subcommands share: the parser that turns argparse errors into one ``error:`` line,
the option groups for model, sampling and drafting, and their checks, which run before any
model is loaded so that bad input is refused in milliseconds."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.api import Model
    from specdec.models import ResolvedModel


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage plus a prefixed line
        raise SpecdecError(message)


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()


def add_model_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """``--model`` and the load options (:data:`specdec.load_options.LOAD`: backend, dtype, exact,
    device, threads, context)."""
    from specdec import option_forms
    from specdec.load_options import LOAD
    from specdec.models import ALIASES, DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"alias ({', '.join(ALIASES)}), a .gguf file or a transformers folder "
                             f"(default: {DEFAULT_MODEL}, on llama.cpp with exact kernels)")
    option_forms.add_spec_arguments(parser, LOAD, skip)


def resolve_model(name: str, backend: str) -> ResolvedModel:
    """``name``'s files as ``backend`` needs them (fetched if needed): the llama.cpp backend reads
    the GGUF and a tokenizer folder taken from it, never the safetensors conversion."""
    from specdec.models import needs_weights_folder, resolve

    return resolve(name, need_hf=needs_weights_folder(backend))


def load_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`specdec.load` that the load options chose (checked: one
    ``error:`` line for the first mistake, spelled as the flag), the backend chosen for
    ``--model`` where ``--backend`` is ``auto`` (:func:`choose_backend`)."""
    from specdec import option_forms
    from specdec.load_options import LOAD, LoadOptions

    chosen = LoadOptions.of(option_forms.spec_values(args, LOAD), spell=option_forms.flag)
    return chosen.for_model(args.model, spell=option_forms.flag).to_dict()


def choose_backend(args: argparse.Namespace) -> None:
    """Check the load options and, where ``--backend`` is ``auto`` (the default), choose the backend
    for ``--model`` and ``--device`` (:func:`specdec.load_options.backend_for`): from here on
    ``args.backend`` is what runs the model, for the checks, the loads (the draft model's too) and
    the results, and :func:`announce` says which it is once the model is loaded."""
    from specdec.load_options import AUTO

    automatic = args.backend == AUTO
    args.backend = load_options(args)["backend"]
    args.chose_backend = automatic or getattr(args, "chose_backend", False)


def announce(args: argparse.Namespace, model: Model) -> None:
    """One line on stderr naming the backend and kernels the command chose for the model it loaded
    (nothing where ``--backend`` named one)."""
    if getattr(args, "chose_backend", False):
        print(f"specdec: {model.loaded.choice}", file=sys.stderr, flush=True)


SAMPLING = ("temperature", "top_k", "top_p", "seed")


def add_options(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """The flags of the generation options ``names`` alone (``specdec bench``: the drafting options
    are in its method specs); :func:`specdec.option_forms.from_args` reads and checks them."""
    from specdec import option_forms
    from specdec.options import core

    option_forms.add_spec_arguments(parser, [core(name) for name in names])


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """The sampling flags alone."""
    add_options(parser, SAMPLING)


def add_generation_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = (), **defaults) -> None:
    """Every generation option (and model options such as ``--memory``) as flags, plus
    ``--draft-model``; from the specs in :mod:`specdec.options`, drafters' own options included."""
    from specdec import option_forms

    parser.add_argument("--draft-model", help="the drafter's model, for drafters that use one")
    option_forms.add_arguments(parser, skip=skip, defaults=defaults)


def generation_options(args: argparse.Namespace):
    """The validated :class:`~specdec.options.GenerationOptions` the flags chose; also checks the
    model options, the draft model's presence and the dtype (before any model loads)."""
    from specdec import option_forms
    from specdec.load_options import draft_model_for
    from specdec.options import all_options

    chosen = option_forms.from_args(args)
    for opt in all_options():
        if opt.scope == "model" and hasattr(args, opt.name):
            wrong = opt.problem(getattr(args, opt.name))
            if wrong:
                raise SpecdecError(wrong)
    # From here on the alias's default is what --draft-model would have said: the commands check,
    # load and name it as if it had been given.
    args.draft_model = draft_model_for(chosen.drafter, getattr(args, "draft_model", None),
                                       getattr(args, "model", None), spell=option_forms.flag)
    choose_backend(args)
    return chosen


def check_positive(value: int, flag: str) -> None:
    if value is not None and value < 1:
        raise SpecdecError(f"{flag} must be >= 1, got {value}")


def check_context(resolved: ResolvedModel, max_new_tokens: int) -> None:
    """Refuse a --max-new-tokens that no prompt could fit beside, from the model folder's config.json.

    Loading the weights takes seconds and the engine would refuse the request anyway (every prompt
    has at least one token); prompts that are merely too long are caught there.
    """
    limit = context_length(resolved.tokenizer_dir)
    if limit is not None and max_new_tokens >= limit:
        raise SpecdecError(f"--max-new-tokens {max_new_tokens} does not fit the context of {resolved.name} "
                           f"({limit} tokens, prompt included): ask for at most {limit - 1}")


def context_length(folder: Path) -> int | None:
    """``max_position_embeddings`` from a transformers (or tokenizer) folder's config.json (None if
    not stated)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
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
