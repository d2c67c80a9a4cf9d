"""One options type for a generation, and the specs every front end derives its fields from.

transformers has ``GenerationConfig`` and vLLM ``SamplingParams`` + ``SpeculativeConfig``; here one
frozen :class:`GenerationOptions` holds what a generation may choose (sampling, drafter, policy,
draft length, tree, verification, stops, ...), validated once by :meth:`GenerationOptions.validate`
with one message per mistake. The CLI's flags, the server's request fields, the keywords of
:meth:`specdec.Model.generate` and the bench's method specs are all built from the
:class:`Option` specs (:func:`all_options`), so a mistake reads the same in every front end.

A drafter declares options of its own in its own file (``@drafter(..., options=[Option(...)])``);
they live in its registry entry (:attr:`specdec.registry.DrafterEntry.options`, their one home),
are read from there with specdec's own (:func:`all_options`, which reads the registry first) and
appear in ``--help``, the API, the server body and the bench spec without touching anything else
(:mod:`specdec.option_forms` spells them as each front end does).
Their values reach the drafter in :attr:`specdec.registry.DraftRequest.options`. Imports flow one
way: this module reads the registry, the registry knows nothing of it.

Options have a *scope*: ``generation`` options may differ per request; ``model`` options (e.g.
``--memory``) configure the loaded model once and are only flags (the server's body cannot set them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from specdec.errors import OptionError, SpecdecError

Check = Callable[[Any], str | None]  # the problem with a value ("must be ..."), or None


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
    scope: str = "generation"  # or "model"
    flag: str | None = ""  # "" = derived from the name
    metavar: str | None = None
    server: bool = True
    bench: bool = True
    bench_key: str | None = None
    owner: str | None = None  # the drafter that declared it (None: specdec's own)

    @property
    def cli_flag(self) -> str | None:
        if self.flag is None:
            return None
        return self.flag or "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this option, as a full sentence; None if it is fine."""
        if value is None:
            return None if self.nullable else f"{self.name} must be given"
        if not _is_type(value, self.type):
            return f"{self.name} must be {TYPE_NAMES[self.type]}, got {value!r}"
        if self.choices is not None:
            names = list(self.choices())
            if value not in names:
                return f"unknown {self.name} {value!r}: use one of {', '.join(names)}"
        if self.check is not None:
            wrong = self.check(value)
            if wrong:
                return f"{self.name} {wrong}, got {value!r}"
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


TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def _is_type(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def at_least(low: int | float) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}"


def _finite_nonnegative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else "must be a finite number >= 0"


def _probability(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _seed(v: int) -> str | None:
    return None if 0 <= v < 2 ** 64 else "must be a whole number from 0 to 2**64-1"


def _drafters() -> list[str]:
    from specdec.registry import DRAFTERS

    return DRAFTERS.names()


def _policies() -> list[str]:
    from specdec.registry import POLICIES

    return POLICIES.names()


def _verify_modes() -> Sequence[str]:
    from specdec.sampling import VERIFY_MODES

    return VERIFY_MODES


# specdec's own options, in --help order. Drafters add theirs at registration (see :func:`register`).
CORE: tuple[Option, ...] = (
    Option("max_new_tokens", int, 64, "new tokens at most", at_least(1), metavar="N", server=False, bench=False),
    Option("temperature", float, 0.0, "0 = greedy (default)", _finite_nonnegative, bench=False),
    Option("top_k", int, 0, "keep the K likeliest tokens; 0 = off (default)",
           lambda v: None if v >= 0 else "must be a whole number >= 0 (0 disables it)", metavar="K", bench=False),
    Option("top_p", float, 1.0, "nucleus sampling, in (0, 1]; 1 = off (default)", _probability, metavar="P",
           bench=False),
    Option("seed", int, None, "seed for sampling (0..2**64-1): the same seed gives the same text with any drafter",
           _seed, nullable=True, bench=False),
    Option("drafter", str, "ngram", "who proposes draft tokens", choices=_drafters, bench=False),
    Option("num_draft", int, None, "draft tokens per step: the most with --policy adaptive, exactly K with "
                                   "--policy fixed", at_least(1), nullable=True, metavar="K", bench_key="k"),
    Option("policy", str, "adaptive", "how many draft tokens to verify", choices=_policies),
    Option("tree", bool, False, "let the draft branch (verified in one target forward with a tree attention mask); "
                                "--num-draft then bounds its number of nodes"),
    Option("verify", str, "coupled", "how sampled drafts are verified: coupled (default; the drafter shares the "
                                     "target's per-position noise, so a seed gives the same text with any drafter) "
                                     "or rejection (rejection sampling, min(1, p/q)); both are lossless",
           choices=_verify_modes),
    Option("stop", tuple, (), "stop at TEXT (repeatable); not part of the output", flag="--stop", metavar="TEXT",
           bench=False),
)

_FEATURES: dict[str, Option] = {}  # declared with register() by drafting features (e.g. the memory)


def register(options: Iterable[Option], owner: str | None = None) -> None:
    """Add options of a drafting feature that is not a drafter (e.g. the memory's ``--memory``,
    ``owner`` None). A drafter declares its own in its registration instead
    (``@drafter(..., options=...)``), where they live and go with it."""
    core = {o.name for o in CORE} | {f.name for f in fields(GenerationOptions)}
    for option in options:
        if option.name in _FEATURES and _FEATURES[option.name] == replace(option, owner=owner):
            continue  # the same module read twice
        if option.name in core or option.name in _FEATURES:
            raise ValueError(f"option {option.name!r} of {owner or 'specdec'} is declared twice")
        _FEATURES[option.name] = replace(option, owner=owner)


def unregister(owner: str) -> None:
    """Forget the options ``owner`` declared with :func:`register` (a drafter's own options go with
    its entry: :meth:`specdec.registry.Registry.remove`)."""
    for name in [n for n, o in _FEATURES.items() if o.owner == owner]:
        del _FEATURES[name]


def declared() -> dict[str, Option]:
    """Options declared outside this module, by name: every registered drafter's (read from the
    registry, whose modules are imported first) and the features'. Drafters that share an option
    (the self and combined drafters' head size) declare the same spec; it is listed once, under
    the first of them."""
    from specdec.registry import DRAFTERS

    found = dict(_FEATURES)
    core = {o.name for o in CORE} | {f.name for f in fields(GenerationOptions)}
    for entry in DRAFTERS:
        for option in entry.options:
            seen = found.get(option.name)
            if seen is not None and replace(seen, owner=None) == replace(option, owner=None):
                continue
            if option.name in core or seen is not None:
                raise ValueError(f"option {option.name!r} of {entry.name} is declared twice")
            found[option.name] = option
    return found


def all_options() -> list[Option]:
    """specdec's options, then every registered drafter's and feature's."""
    return list(CORE) + list(declared().values())


def option(name: str) -> Option:
    for o in all_options():
        if o.name == name:
            return o
    raise SpecdecError(f"unknown option {name!r}: use one of {', '.join(o.name for o in all_options())}")


def generation_options() -> list[Option]:
    return [o for o in all_options() if o.scope == "generation"]


@dataclass(frozen=True)
class GenerationOptions:
    """Everything one generation may choose, frozen and validated (:meth:`validate`).

    Drafter-declared options live in ``extra`` (name -> value; read with ``options["name"]``).
    Build one with keywords (``GenerationOptions(temperature=0.7, drafter="recycle")``), from a
    mapping that may hold drafter options too (:meth:`of`), or change one with :meth:`with_`.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    drafter: str = "ngram"
    num_draft: int | None = None
    policy: str = "adaptive"
    tree: bool = False
    verify: str = "coupled"
    stop: tuple[str, ...] = ()
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
        core = {f.name for f in fields(cls)} - {"extra"}
        known = {o.name for o in generation_options()}
        unknown = [k for k in values if k not in core and k not in known]
        if unknown:
            raise SpecdecError(f"unknown option {unknown[0]!r}: use one of {', '.join(sorted(core | known))}")
        base = base or cls()
        extra = {**base.extra, **{k: v for k, v in values.items() if k not in core}}
        return replace(base, **{k: v for k, v in values.items() if k in core}, extra=extra)

    def with_(self, **values: Any) -> GenerationOptions:
        return GenerationOptions.of(values, self)

    def __getitem__(self, name: str) -> Any:
        """Any option's value by name, a drafter's own options with their declared default."""
        if name in self.extra:
            return self.extra[name]
        if name in {f.name for f in fields(self)} - {"extra"}:
            return getattr(self, name)
        return option(name).default

    def validate(self) -> GenerationOptions:
        """Check every value; the first mistake raises :class:`SpecdecError` with the message every
        front end shows (e.g. ``num_draft must be >= 1, got 0``). Returns ``self``."""
        for opt in all_options():
            if opt.scope != "generation":
                continue
            value = self[opt.name]
            if opt.name == "stop":
                if not all(isinstance(s, str) for s in value):
                    raise OptionError(f"stop must be a string or a list of strings, got {list(value)!r}", "stop")
                continue
            wrong = opt.problem(value)
            if wrong:
                raise OptionError(wrong, opt.name)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Every generation option by name (drafter options with their defaults)."""
        return {o.name: (list(self[o.name]) if o.name == "stop" else self[o.name]) for o in generation_options()}

    @property
    def sampling(self):
        from specdec.sampling import SamplingParams

        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class _Frozen(dict):
    """A dict that refuses changes (the options are frozen, their extra too) and hashes by value."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("GenerationOptions are frozen: use .with_(...)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))
