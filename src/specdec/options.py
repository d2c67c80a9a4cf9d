"""Options: each declared once, with its default, check, help and flag, and every configuration
type derived from those declarations.

transformers has ``GenerationConfig`` and vLLM ``SamplingParams`` + ``SpeculativeConfig``; here one
frozen :class:`GenerationOptions` holds what a generation may choose (sampling, drafter, policy,
draft length, tree, verification, stops, ...), validated once by :meth:`GenerationOptions.validate`
with one message per mistake. Each of its fields *is* an option's declaration (:func:`declare`):
the default is the field's, the name, type and whether None is allowed are its annotation's, and
the help, check and flag sit beside them. :func:`options_of` reads the :class:`Option` specs from
a class so declared; the load and serve options (:mod:`specdec.load_options`) are declared the
same way, and the engine's own small types (:class:`~specdec.sampling.SamplingParams`,
:class:`~specdec.engine.DecodeConfig`) take the options they hold with :func:`same_as`. The CLI's
flags, the server's request fields, the keywords of :meth:`specdec.Model.generate` and the bench's
method specs are all built from the specs (:func:`all_options`), so a mistake reads the same in
every front end.

The dataclass is the declaration, rather than a class generated from a table of specs, because it
is the public type: type checkers, IDEs and the API reference read its fields, which a generated
class would hide from all three; reading the specs from it loses nothing.

A drafter declares options of its own in its own file (``@drafter(..., options=[Option(...)])``);
they live in its registry entry (:attr:`specdec.registry.DrafterEntry.options`, their one home),
are read from there with specdec's own (:func:`all_options`, which reads the registry first) and
appear in ``--help``, the API, the server body and the bench spec without touching anything else
(:mod:`specdec.option_forms` spells them as each front end does).
Their values reach the drafter in :attr:`specdec.registry.DraftRequest.options`. Imports flow one
way: this module reads the registry, the registry knows nothing of it.

Options have a *scope*: ``generation`` options may differ per request; ``model`` options (e.g.
``--memory``) configure the loaded model once and are only flags (the server's body cannot set
them); ``load`` and ``serve`` options are :mod:`specdec.load_options`'.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from specdec.errors import OptionError, SpecdecError

Check = Callable[[Any], str | None]  # the problem with a value ("must be ..."), or None
Spell = Callable[[str], str]  # an option as a front end names it (--max-tokens, max_tokens)
T = TypeVar("T")


def flag(name: str) -> str:
    """An option as the command line spells it (``max_new_tokens`` -> ``--max-new-tokens``)."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """One option: its name (API keyword and server field), type, default, help and check.

    ``check`` returns what is wrong with a value, phrased to follow the option's name ("must be a
    whole number >= 1"); ``choices`` are read lazily (from a registry). ``flag`` is the CLI flag
    (``--`` + name with dashes by default, None: not on the CLI); ``server`` and ``bench`` say
    whether the server's body and the bench's method specs accept it (``bench_key``: its short name
    there). ``nullable`` allows None (meaning "the drafter's / policy's own default").
    """

    name: str
    type: type
    default: Any
    help: str
    check: Check | None = None
    choices: Callable[[], Sequence[str]] | None = None
    nullable: bool = False
    scope: str = "generation"  # or "model", "load", "serve"
    flag: str | None = ""  # "" = derived from the name
    metavar: str | None = None
    server: bool = True
    bench: bool = True
    bench_key: str | None = None
    owner: str | None = None  # the drafter that declared it (None: specdec's own)

    @property
    def cli_flag(self) -> str | None:
        """The option's flag on the command line (None: it has none)."""
        if self.flag is None:
            return None
        return self.flag or flag(self.name)

    def problem(self, value: Any, spell: Spell = str) -> str | None:
        """What is wrong with ``value`` for this option, as a full sentence naming the option as
        ``spell`` does; None if it is fine."""
        name = spell(self.name)
        if value is None:
            return None if self.nullable else f"{name} must be given"
        shown = list(value) if isinstance(value, tuple) else value  # as it was given: a list
        if not _is_type(value, self.type):
            return f"{name} must be {TYPE_NAMES[self.type]}, got {shown!r}"
        if self.choices is not None:
            names = list(self.choices())
            if value not in names:
                return f"unknown {name} {value!r}: use one of {', '.join(names)}"
        if self.check is not None:
            wrong = self.check(value)
            if wrong:
                return f"{name} {wrong}, got {shown!r}"
        return None

    def parse(self, text: str) -> Any:
        """A value from text (a CLI argument, a bench spec's ``key=value``): typed, not yet checked."""
        if self.type is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on", ""):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise SpecdecError(f"{self.name} must be true or false, got {text!r}")
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise SpecdecError(f"{self.name} must be {TYPE_NAMES[int]}, got {text!r}") from None
        if self.type is float:
            try:
                return float(text)
            except ValueError:
                raise SpecdecError(f"{self.name} must be {TYPE_NAMES[float]}, got {text!r}") from None
        return text


TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
              tuple: "a string or a list of strings"}


def _is_type(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check(specs: Iterable[Option], value_of: Callable[[str], Any], spell: Spell = str) -> None:
    """Raise :class:`OptionError` for the first of ``specs`` whose value (``value_of(name)``) it
    refuses, named as ``spell`` names it."""
    for spec in specs:
        wrong = spec.problem(value_of(spec.name), spell)
        if wrong:
            raise OptionError(wrong, spec.name)


# -- declaring options as the fields of a configuration class -----------------------------------------
_DECLARATION = "specdec.option"  # the key of a field's metadata that declares its option


def declare(default: Any, help: str, check: Check | None = None, **spec: Any) -> Any:
    """A dataclass field that declares an option: its default, help and check, and how the front
    ends spell it (any other :class:`Option` field: ``choices``, ``flag``, ``metavar``, ``server``,
    ``bench``, ``bench_key``). Its name, type and whether None is allowed are the field's own, and
    its scope the class's ``SCOPE``; :func:`options_of` reads them."""
    return field(default=default, metadata={_DECLARATION: dict(help=help, check=check, **spec)})


def same_as(name: str) -> Any:
    """A field of an engine type that holds the generation option ``name``: its default and check
    are that option's (a bad value reads as it does in every front end), and :func:`copy_into`
    fills it from the options."""
    spec = core(name)
    return field(default=spec.default, metadata={_DECLARATION: spec})


@functools.cache
def options_of(cls: type) -> tuple[Option, ...]:
    """The options ``cls``'s fields declare (:func:`declare`, :func:`same_as`), in field order."""
    hints = typing.get_type_hints(cls)
    scope = getattr(cls, "SCOPE", "generation")
    found = []
    for f in fields(cls):
        declared = f.metadata.get(_DECLARATION)
        if isinstance(declared, Option):
            if declared.name != f.name:
                raise TypeError(f"{cls.__name__}.{f.name} holds option {declared.name!r}: name it so")
            found.append(declared)
        elif declared is not None:
            kind, nullable = _kind(hints[f.name])
            found.append(Option(f.name, kind, f.default, nullable=nullable, scope=scope, **declared))
    return tuple(found)


def _kind(hint: Any) -> tuple[type, bool]:
    """An annotation's option type and whether it allows None (``int | None``: int, True)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _kind(inner)[0], True
    return typing.get_origin(hint) or hint, False  # tuple[str, ...] is a tuple


def check_fields(obj: Any, spell: Spell = str) -> None:
    """Check every field of ``obj`` that declares an option (:func:`options_of`)."""
    check(options_of(type(obj)), functools.partial(getattr, obj), spell)


def copy_into(cls: type[T], options: GenerationOptions, **rest: Any) -> T:
    """An engine type built from validated ``options``: every field that holds an option
    (:func:`same_as`) takes its value, ``rest`` are the others."""
    return cls(**{spec.name: options[spec.name] for spec in options_of(cls)}, **rest)


# -- the checks and choices of specdec's own options ---------------------------------------------------
def at_least(low: int | float) -> Check:
    """A check: the value is ``low`` or more."""
    return lambda v: None if v >= low else f"must be >= {low}"


def _finite_nonnegative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else "must be a finite number >= 0"


def _nonnegative_or_off(v: int) -> str | None:
    return None if v >= 0 else "must be a whole number >= 0 (0 disables it)"


def _probability(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _seed(v: int) -> str | None:
    return None if 0 <= v < 2 ** 64 else "must be a whole number from 0 to 2**64-1"


def _strings(v: tuple) -> str | None:
    return None if all(isinstance(s, str) for s in v) else "must be a string or a list of strings"


def _drafters() -> list[str]:
    from specdec.registry import DRAFTERS

    return DRAFTERS.names()


def _policies() -> list[str]:
    from specdec.registry import POLICIES

    return POLICIES.names()


# How sampled drafts are verified (specdec.verify); the engine reads the option, so it lives here.
VERIFY_MODES = ("coupled", "rejection")


def _verify_modes() -> Sequence[str]:
    return VERIFY_MODES


@dataclass(frozen=True)
class GenerationOptions:
    """Everything one generation may choose, frozen and validated (:meth:`validate`).

    Each field declares its option (default, check, help, flag; in ``--help`` order). Drafter-
    declared options live in ``extra`` (name -> value; read with ``options["name"]``). Build one
    with keywords (``GenerationOptions(temperature=0.7, drafter="recycle")``), from a mapping that
    may hold drafter options too (:meth:`of`), or change one with :meth:`with_`.
    """

    SCOPE: ClassVar[str] = "generation"

    max_new_tokens: int = declare(64, "new tokens at most", at_least(1), metavar="N", bench=False)
    temperature: float = declare(0.0, "0 = greedy (default)", _finite_nonnegative, bench=False)
    top_k: int = declare(0, "keep the K likeliest tokens; 0 = off (default)", _nonnegative_or_off, metavar="K",
                         bench=False)
    top_p: float = declare(1.0, "nucleus sampling, in (0, 1]; 1 = off (default)", _probability, metavar="P",
                           bench=False)
    seed: int | None = declare(None, "seed for sampling (0..2**64-1): the same seed gives the same text with any "
                                     "drafter", _seed, bench=False)
    drafter: str = declare("ngram", "who proposes draft tokens", choices=_drafters, bench=False)
    num_draft: int | None = declare(None, "draft tokens per step: the most with --policy adaptive, exactly K with "
                                          "--policy fixed", at_least(1), metavar="K", bench_key="k")
    policy: str = declare("adaptive", "how many draft tokens to verify", choices=_policies)
    tree: bool = declare(False, "let the draft branch (verified in one target forward with a tree attention mask); "
                                "--num-draft then bounds its number of nodes")
    verify: str = declare("coupled", "how sampled drafts are verified: coupled (default; the drafter shares the "
                                     "target's per-position noise, so a seed gives the same text with any drafter) "
                                     "or rejection (rejection sampling, min(1, p/q)); both are lossless",
                          choices=_verify_modes)
    stop: tuple[str, ...] = declare((), "stop at TEXT (repeatable); not part of the output", _strings,
                                    metavar="TEXT", bench=False)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list):
            stop = tuple(stop)
        object.__setattr__(self, "stop", stop)
        # A drafter option left at its default is not stored, so equal requests compare equal
        # whichever front end spelled them (the CLI passes every flag's default), whatever was
        # imported before (the declarations are read from the registry, which imports them).
        known = declared() if self.extra else {}
        extra = {k: v for k, v in self.extra.items() if k not in known or v != known[k].default}
        object.__setattr__(self, "extra", _Frozen(extra))

    @classmethod
    def of(cls, values: Mapping[str, Any] | None = None, base: GenerationOptions | None = None) -> GenerationOptions:
        """Options from ``values`` (any option names, drafter-declared included) over ``base``
        (the defaults when None); unknown names are refused. Not validated yet."""
        values = dict(values or {})
        known = {o.name for o in generation_options()}
        unknown = [k for k in values if k not in _CORE and k not in known]
        if unknown:
            raise SpecdecError(f"unknown option {unknown[0]!r}: use one of {', '.join(sorted(_CORE.keys() | known))}")
        base = base or cls()
        extra = {**base.extra, **{k: v for k, v in values.items() if k not in _CORE}}
        return replace(base, **{k: v for k, v in values.items() if k in _CORE}, extra=extra)

    def with_(self, **values: Any) -> GenerationOptions:
        """These options with ``values`` over them (not validated yet)."""
        return GenerationOptions.of(values, self)

    def __getitem__(self, name: str) -> Any:
        """Any option's value by name, a drafter's own options with their declared default."""
        if name in self.extra:
            return self.extra[name]
        if name in _CORE:
            return getattr(self, name)
        return option(name).default

    def validate(self, spell: Spell = str) -> GenerationOptions:
        """Check every value; the first mistake raises :class:`SpecdecError` with the message every
        front end shows (e.g. ``num_draft must be >= 1, got 0``), the option named as ``spell``
        names it (the server's body says ``max_tokens``). Returns ``self``."""
        check(generation_options(), self.__getitem__, spell)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Every generation option by name (drafter options with their defaults)."""
        out = {o.name: self[o.name] for o in generation_options()}
        return {name: list(v) if isinstance(v, tuple) else v for name, v in out.items()}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# specdec's own options, in --help order. Drafters add theirs at registration (see :func:`register`).
CORE: tuple[Option, ...] = options_of(GenerationOptions)
_CORE: dict[str, Option] = {o.name: o for o in CORE}


def core(name: str) -> Option:
    """specdec's own generation option ``name`` (a field of :class:`GenerationOptions`)."""
    return _CORE[name]


_FEATURES: dict[str, Option] = {}  # declared with register() by drafting features (e.g. the memory)


def register(options: Iterable[Option], owner: str | None = None) -> None:
    """Add options of a drafting feature that is not a drafter (e.g. the memory's ``--memory``,
    ``owner`` None). A drafter declares its own in its registration instead
    (``@drafter(..., options=...)``), where they live and go with it."""
    for option in options:
        if option.name in _FEATURES and _FEATURES[option.name] == replace(option, owner=owner):
            continue  # the same module read twice
        if option.name in _CORE or option.name == "extra" or option.name in _FEATURES:
            raise ValueError(f"option {option.name!r} of {owner or 'specdec'} is declared twice")
        _FEATURES[option.name] = replace(option, owner=owner)


def unregister(owner: str | None = None, *, names: Iterable[str] = ()) -> None:
    """Forget the options declared with :func:`register` by ``owner``, or named in ``names`` (a
    drafter's own options go with its entry: :meth:`specdec.registry.Registry.remove`)."""
    names = set(names)
    for name in [n for n, o in _FEATURES.items() if (owner is not None and o.owner == owner) or n in names]:
        del _FEATURES[name]


def declared() -> dict[str, Option]:
    """Options declared outside this module, by name: every registered drafter's (read from the
    registry, whose modules are imported first) and the features'. Drafters that share an option
    (the self and combined drafters' head size) declare the same spec; it is listed once, under
    the first of them."""
    from specdec.registry import DRAFTERS

    entries = list(DRAFTERS)  # first: importing the drafters' modules registers the features they use
    found = dict(_FEATURES)
    for entry in entries:
        for option in entry.options:
            seen = found.get(option.name)
            if seen is not None and replace(seen, owner=None) == replace(option, owner=None):
                continue
            if option.name in _CORE or option.name == "extra" or seen is not None:
                raise ValueError(f"option {option.name!r} of {entry.name} is declared twice")
            found[option.name] = option
    return found


def all_options() -> list[Option]:
    """specdec's options, then every registered drafter's and feature's."""
    return list(CORE) + list(declared().values())


def option(name: str) -> Option:
    """Any option by name (specdec's, a drafter's or a feature's)."""
    for o in all_options():
        if o.name == name:
            return o
    raise SpecdecError(f"unknown option {name!r}: use one of {', '.join(o.name for o in all_options())}")


def generation_options() -> list[Option]:
    """The options a generation may choose (scope ``generation``)."""
    return [o for o in all_options() if o.scope == "generation"]


class _Frozen(dict):
    """A dict that refuses changes (the options are frozen, their extra too) and hashes by value."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("GenerationOptions are frozen: use .with_(...)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))
