"""The generation options as each front end spells them: the CLI's flags (:func:`add_arguments`,
:func:`from_args`), a server request's body fields (:func:`server_fields`, :func:`from_body`) and a
bench method's ``key=value`` spec (:func:`from_spec`). Every field comes from an
:class:`~specdec.options.Option` spec, and every value is checked by
:meth:`~specdec.options.GenerationOptions.validate`, so a mistake reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdec.errors import SpecdecError
from specdec.options import TYPE_NAMES, GenerationOptions, Option, all_options, flag, generation_options

# The request body's names that are not specdec's (OpenAI's max_tokens is max_new_tokens): mapped
# here, at the server's edge, and nowhere inside.
BODY_NAMES = {"max_new_tokens": "max_tokens"}

__all__ = ["BODY_NAMES", "add_arguments", "add_spec_arguments", "body_name", "flag", "from_args", "from_body",
           "from_spec", "server_fields", "spec_values"]


def add_arguments(parser, scopes: tuple[str, ...] = ("generation", "model"), skip: tuple[str, ...] = (),
                  defaults: Mapping[str, Any] | None = None) -> None:
    """argparse flags for every generation and model option with a flag (help and choices from the
    specs). Values are checked by :func:`from_args` (so the message is the same as the server's
    and the API's)."""
    add_spec_arguments(parser, [o for o in all_options() if o.scope in scopes], skip, defaults)


def add_spec_arguments(parser, specs, skip: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None) -> None:
    """argparse flags for ``specs`` (e.g. the load and serve options of :mod:`specdec.load_options`)."""
    import argparse

    defaults = dict(defaults or {})
    for opt in specs:
        if opt.cli_flag is None or opt.name in skip:
            continue
        default = defaults.get(opt.name, opt.default)
        shown = "" if default in (None, (), "") else f" (default: {default})"
        owner = f" [{opt.owner} drafter]" if opt.owner else ""
        kwargs: dict[str, Any] = dict(dest=opt.name, help=opt.help + owner + (shown if "default" not in opt.help else ""))
        if opt.type is bool:
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        elif opt.type is tuple:
            kwargs.update(action="append", default=None, metavar=opt.metavar)
        else:
            kwargs.update(type=_arg_type(opt), default=default, metavar=opt.metavar)
            if opt.choices is not None:
                # Shown, not enforced by argparse: the options' own check words the mistake the
                # same way as the server and the API do.
                kwargs["metavar"] = "{" + ",".join(opt.choices()) + "}"
                helps = _choice_help(opt)
                if helps:
                    kwargs["help"] = helps + (shown or "")
        parser.add_argument(opt.cli_flag, **kwargs)


def _arg_type(opt: Option):
    def convert(text: str):
        return opt.parse(text)
    convert.__name__ = TYPE_NAMES.get(opt.type, "value")  # argparse names the type in its error
    return convert


def _choice_help(opt: Option) -> str | None:
    from specdec.registry import BACKENDS, DRAFTERS, POLICIES

    from specdec.load_options import AUTO, AUTO_HELP

    registry = {"drafter": DRAFTERS, "policy": POLICIES, "backend": BACKENDS}.get(opt.name)
    if registry is None:
        return None
    chosen = [f"{AUTO}: {AUTO_HELP}"] if opt.name == "backend" else []  # not an entry: it picks one
    return "; ".join(chosen + [f"{e.name}: {e.help}" for e in registry])


def from_args(args, base: GenerationOptions | None = None) -> GenerationOptions:
    """The generation options parsed flags chose, validated."""
    values = {o.name: getattr(args, o.name) for o in generation_options()
              if o.cli_flag is not None and hasattr(args, o.name)}
    if values.get("stop") is None:
        values.pop("stop", None)
    return GenerationOptions.of(values, base).validate()


def from_body(body: Mapping[str, Any], base: GenerationOptions) -> GenerationOptions:
    """The options a server request body chose (fields it leaves out or sets to null keep
    ``base``, the server's defaults), validated; a mistake names the option as the body does
    (:func:`body_name`)."""
    allowed = {o.name for o in generation_options() if o.server}
    values = {k: v for k, v in body.items() if k in allowed and v is not None}
    return GenerationOptions.of(values, base).validate(spell=body_name)


def body_name(name: str) -> str:
    """An option as a server request's body names it (``max_new_tokens`` -> ``max_tokens``)."""
    return BODY_NAMES.get(name, name)


def from_spec(pairs: Mapping[str, str], base: GenerationOptions) -> GenerationOptions:
    """The options a bench method spec chose (``key=value`` texts, short keys allowed), validated."""
    by_key = {}
    for o in generation_options():
        if o.bench:
            by_key[o.name] = o
            if o.bench_key:
                by_key[o.bench_key] = o
    values = {}
    for key, text in pairs.items():
        opt = by_key.get(key)
        if opt is None:
            raise SpecdecError(f"unknown option {key!r}: use one of {', '.join(sorted(by_key))}")
        values[opt.name] = opt.parse(text)
    return GenerationOptions.of(values, base).validate()


def server_fields() -> list[Option]:
    """The options a request body may set (some by OpenAI's names: :func:`body_name`)."""
    return [o for o in generation_options() if o.server]


def spec_values(args, specs) -> dict[str, Any]:
    """The values parsed flags gave ``specs`` (those the parser has)."""
    return {o.name: getattr(args, o.name) for o in specs if hasattr(args, o.name)}
