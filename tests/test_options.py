"""One options type: every front end reads it, every mistake reads the same, every drafter is exact.

The drafter tests are parametrized over the registry itself, so a drafter added as one new file is
checked for greedy exactness and seeded sampling without anyone adding it to a list.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import specdec
from specdec import option_forms, options
from specdec.cli import build_parser, main
from specdec.drafters.base import Drafter
from specdec.errors import SpecdecError
from specdec.options import GenerationOptions, Option, at_least
from specdec.registry import DRAFTERS, DraftRequest, drafter
from specdec.types import Draft

PROMPT = "the quick brown fox jumps over the lazy dog and the quick brown fox"


@pytest.fixture(scope="module")
def tiny_draft(tiny_draft_dir):
    return specdec.load(str(tiny_draft_dir))


@pytest.fixture(scope="module")
def tiny_twin(tiny_model_dir):
    """The target's own weights as a draft model: the other tiny model's greedy drafts are never
    the target's token, and a run that rejects every draft would pass as plain decoding does."""
    return specdec.load(str(tiny_model_dir))


def _extra(name: str, draft_model) -> dict:
    return {"draft_model": draft_model} if DRAFTERS.get(name).needs_draft_model else {}


# A fixed draft length, so that every step verifies a draft: the adaptive policy may rightly take
# plain steps on a model this small, and a plain step proves nothing about exactness.
FIXED = dict(policy="fixed", num_draft=4)


@pytest.fixture()
def drafting_whenever_possible(monkeypatch):
    """Self-drafting sizes its drafts by measured costs (layer passes against the LM head) and, on
    a model this small, rightly declines to draft: made to draft whatever the costs."""
    from specdec.drafters.self_spec import SelfDrafter

    monkeypatch.setattr(SelfDrafter, "_worth", lambda self, survival: True)


# -- every registered drafter, found in the registry -------------------------------------------
def _drafters():
    """Every registered drafter but the baseline (``none``: the plain decoding compared with);
    one whose optional build is missing here skips, saying which."""
    return [pytest.param(e.name, marks=pytest.mark.skipif(bool(e.missing()), reason=e.missing() or ""))
            for e in DRAFTERS if e.name != "none"]


@pytest.mark.parametrize("name", _drafters())
@pytest.mark.parametrize("tree", [False, True])
def test_every_registered_drafter_gives_plain_greedy_tokens(tiny, tiny_twin, name, tree,
                                                           drafting_whenever_possible):
    plain = tiny.generate(PROMPT, max_new_tokens=24, drafter="none")
    out = tiny.generate(PROMPT, max_new_tokens=24, drafter=name, tree=tree, **FIXED,
                        **_extra(name, tiny_twin))
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted > 0, "no draft token was accepted: the comparison says nothing"


@pytest.mark.parametrize("name", _drafters())
@pytest.mark.parametrize("seed", [3, 11])
def test_every_registered_drafter_gives_the_seeded_plain_text(tiny, tiny_draft, name, seed,
                                                             drafting_whenever_possible):
    sampling = dict(temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=24)
    plain = tiny.generate(PROMPT, drafter="none", **sampling)
    out = tiny.generate(PROMPT, drafter=name, **sampling, **FIXED, **_extra(name, tiny_draft))
    assert out.token_ids == plain.token_ids
    # Drafts verified, not necessarily accepted: the tiny model's weights are random, its samples
    # follow nothing in the prompt, and the lookups' drafts are rightly rejected.
    assert out.stats.drafted > 0, "no draft was verified: the comparison says nothing"


# -- a drafter defined here, with an option of its own ------------------------------------------
class RepeatDrafter(Drafter):
    """Drafts the last ``span`` tokens again (right often enough on a repetitive prompt)."""

    name = "repeat-test"

    def __init__(self, span: int) -> None:
        self.span = span

    def propose(self, tokens: Sequence[int], k: int, stop=None) -> Draft:
        return Draft(list(tokens[-self.span:])[:k])


SPANS: list[int] = []


@pytest.fixture()
def repeat_drafter():
    """Registers ``repeat-test`` with its option ``repeat_span`` for one test, as a drafter file would."""
    @drafter("repeat-test", "test drafter: repeats the last tokens", options=[
        Option("repeat_span", int, 2, "how many of the last tokens to draft again", at_least(1), metavar="N")])
    def build(request: DraftRequest) -> Drafter:
        SPANS.append(request.options["repeat_span"])
        return RepeatDrafter(request.options["repeat_span"])

    SPANS.clear()
    yield "repeat-test"
    DRAFTERS.remove("repeat-test")  # its option goes with it: the entry is the option's one home


def test_a_drafter_with_an_option_is_one_registration(repeat_drafter, tiny, capsys):
    # The CLI's --help lists the drafter and its option.
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = capsys.readouterr().out
    assert "repeat-test" in help_text and "--repeat-span" in help_text
    # The API takes the option as a keyword and hands it to the drafter; output stays exact.
    plain = tiny.generate(PROMPT, max_new_tokens=16, drafter="none")
    out = tiny.generate(PROMPT, max_new_tokens=16, drafter="repeat-test", repeat_span=3)
    assert out.token_ids == plain.token_ids and SPANS[-1] == 3
    # The same option from the CLI flags and from a server body.
    args = build_parser().parse_args(["generate", "x", "--drafter", "repeat-test", "--repeat-span", "4"])
    assert option_forms.from_args(args)["repeat_span"] == 4
    assert "repeat_span" in {o.name for o in option_forms.server_fields()}
    assert option_forms.from_body({"drafter": "repeat-test", "repeat_span": 5}, GenerationOptions())["repeat_span"] == 5
    # ... and from a bench method spec.
    assert option_forms.from_spec({"repeat_span": "6"}, GenerationOptions(drafter="repeat-test"))["repeat_span"] == 6
    with pytest.raises(SpecdecError, match=r"^repeat_span must be >= 1, got 0$"):
        tiny.generate(PROMPT, drafter="repeat-test", repeat_span=0)


def test_the_drafter_is_gone_after_the_test():
    assert "repeat-test" not in DRAFTERS
    assert "repeat_span" not in {o.name for o in options.all_options()}
    with pytest.raises(SpecdecError, match="unknown option 'repeat_span'"):
        GenerationOptions.of({"repeat_span": 3})


def test_equal_options_compare_equal_before_any_drafter_is_imported(tmp_path):
    """A drafter's option left at its default is dropped, so the options equal those that do not
    name it, also in a process that has not read the registry yet (the declaration is read from
    the drafter's entry, and reading it imports the drafters)."""
    import subprocess
    import sys

    lazy = [(o.name, o.default) for e in DRAFTERS for o in e.options
            if e.name not in ("none", "ngram", "model")]  # drafters that ``import specdec`` does not import
    assert lazy, "every drafter with an option is imported by specdec/__init__: pick another case"
    name, default = lazy[0]
    script = (f"from specdec.options import GenerationOptions as G\n"
              f"a, b = G(extra={{{name!r}: {default!r}}}), G()\n"
              f"print(a == b, hash(a) == hash(b), a.extra)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "{}"], out.stdout + out.stderr


def test_a_fresh_process_knows_every_option_before_anything_is_imported():
    """The options a feature registers when its module is imported (the n-gram memory's
    ``--memory``, imported by the n-gram drafters) are there in a process that imported nothing
    else first, as in ``specdec generate`` run from a shell."""
    import subprocess
    import sys

    script = "from specdec.options import all_options\nprint(' '.join(sorted(o.name for o in all_options())))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "memory" in out.stdout.split()
    assert out.stdout.split() == sorted(o.name for o in options.all_options()), out.stderr


# -- one request, four front ends -------------------------------------------------------------------
REQUEST = dict(drafter="recycle", num_draft=3, policy="fixed", tree=True, verify="rejection", temperature=0.5,
               top_k=5, top_p=0.9, seed=3)
FLAGS = ["--drafter", "recycle", "--num-draft", "3", "--policy", "fixed", "--tree", "--verify", "rejection",
         "--temperature", "0.5", "--top-k", "5", "--top-p", "0.9", "--seed", "3"]


def test_cli_flags_server_body_api_keywords_and_bench_spec_give_the_same_options(tiny):
    from specdec.commands.common import generation_options

    api = tiny.start(PROMPT, **REQUEST).options
    args = build_parser().parse_args(["generate", PROMPT, "--max-new-tokens", "64", *FLAGS])
    cli = generation_options(args)
    body = option_forms.from_body(REQUEST, GenerationOptions())
    sampling = {k: REQUEST[k] for k in ("temperature", "top_k", "top_p", "seed")}
    spec = option_forms.from_spec({"k": "3", "policy": "fixed", "tree": "", "verify": "rejection"},
                             GenerationOptions(drafter="recycle", **sampling))
    assert api == cli == body == spec
    assert api.to_dict()["num_draft"] == 3


BAD = [dict(num_draft=0), dict(top_p=0.0), dict(temperature=-1.0), dict(top_k=-2), dict(drafter="medusa"),
       dict(policy="greedy"), dict(verify="strict"), dict(max_new_tokens=0), dict(seed=-1)]


def _message(values: dict) -> str:
    with pytest.raises(SpecdecError) as caught:
        GenerationOptions.of(values).validate()
    return str(caught.value)


def _flags(values: dict) -> list[str]:
    out = []
    for name, value in values.items():
        out += ["--" + name.replace("_", "-"), str(value)]
    return out


@pytest.mark.parametrize("values", BAD, ids=lambda v: next(iter(v)))
def test_every_front_end_refuses_a_bad_option_with_the_same_message(tiny, tiny_model_dir, capsys, values):
    expected = _message(values)
    # API
    with pytest.raises(SpecdecError) as api:
        tiny.generate(PROMPT, **values)
    assert str(api.value) == expected
    # CLI: one error line, before the model loads
    code = main(["generate", PROMPT, "--model", str(tiny_model_dir), *_flags(values)])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"error: {expected}"
    # Server body
    if next(iter(values)) != "max_new_tokens":  # the body calls it max_tokens (OpenAI's name)
        with pytest.raises(SpecdecError) as body:
            option_forms.from_body(values, GenerationOptions())
        assert str(body.value) == expected


def test_options_are_frozen_and_compare_by_value():
    a = GenerationOptions(temperature=0.5, stop="END")
    assert a.stop == ("END",)
    assert a == GenerationOptions.of({"temperature": 0.5, "stop": ["END"]})
    with pytest.raises(Exception):
        a.temperature = 1.0  # type: ignore[misc]
    assert a.with_(temperature=0.0).greedy and not a.greedy
    with pytest.raises(SpecdecError, match="unknown option 'temprature'"):
        GenerationOptions.of({"temprature": 1})


# -- one declaration, every front end and every configuration type ------------------------------------
@pytest.fixture()
def budget_option():
    """A generation option no drafter owns (``probe_budget``), declared for one test in one place,
    the way a drafting feature declares one, and forgotten after."""
    options.register([Option("probe_budget", int, 5, "test option: how much to probe", at_least(1), metavar="N")])
    yield "probe_budget"
    options.unregister(names=["probe_budget"])
    assert "probe_budget" not in {o.name for o in options.all_options()}


def test_an_option_declared_once_is_a_flag_a_keyword_and_a_body_field(budget_option, tiny, tiny_model_dir, capsys):
    from fastapi.testclient import TestClient

    from specdec.server.app import ServeConfig, Server
    from specdec.server.schemas import CompletionRequest, with_specdec_fields

    # The CLI: a flag of `specdec generate`, parsed into the options.
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--probe-budget N" in capsys.readouterr().out
    args = build_parser().parse_args(["generate", PROMPT, "--probe-budget", "3"])
    assert option_forms.from_args(args)["probe_budget"] == 3
    # The Python API: a keyword of Model.generate that reaches the run's GenerationOptions.
    run = tiny.start(PROMPT, max_new_tokens=2, probe_budget=4)
    run.close()
    assert run.options["probe_budget"] == 4 and run.options.to_dict()["probe_budget"] == 4
    # The server: a field of the request body, over the server's default.
    body_type = with_specdec_fields(CompletionRequest)
    assert "probe_budget" in body_type.model_fields
    server = Server(tiny, config=ServeConfig(max_tokens=4))
    request = body_type.model_validate({"model": tiny.name, "prompt": PROMPT, "probe_budget": 6})
    assert server.options(request, None, [1, 2, 3])["probe_budget"] == 6
    # A bad value reads the same in all three.
    expected = _message(dict(probe_budget=0))
    assert expected == "probe_budget must be >= 1, got 0"
    with pytest.raises(SpecdecError) as api:
        tiny.generate(PROMPT, probe_budget=0)
    assert str(api.value) == expected
    assert main(["generate", PROMPT, "--model", str(tiny_model_dir), "--probe-budget", "0"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {expected}"
    with TestClient(server.app()) as http:
        wrong = http.post("/v1/completions", json={"model": tiny.name, "prompt": PROMPT, "probe_budget": 0})
    assert wrong.status_code == 400
    assert (wrong.json()["error"]["message"], wrong.json()["error"]["param"]) == (expected, "probe_budget")


def test_the_configuration_types_are_derived_from_the_declarations():
    from dataclasses import fields

    from specdec.engine import DecodeConfig
    from specdec.load_options import LOAD, SERVE, LoadOptions, ServeOptions
    from specdec.sampling import SamplingParams
    from specdec.server.settings import ServeConfig

    # The load and serve options' fields are their specs, the server's config is the serve options and more.
    assert [f.name for f in fields(LoadOptions)] == [o.name for o in LOAD]
    assert LoadOptions() == LoadOptions(**{o.name: o.default for o in LOAD})
    assert ServeConfig() == ServeConfig(**{o.name: o.default for o in SERVE})
    assert {f.name for f in fields(ServeOptions)} <= {f.name for f in fields(ServeConfig)}
    # The engine's types hold the generation options' defaults and refuse a value with their message.
    defaults = GenerationOptions()
    assert DecodeConfig.of(defaults) == DecodeConfig()
    assert (DecodeConfig().max_new_tokens, DecodeConfig().verify) == (defaults.max_new_tokens, defaults.verify)
    assert SamplingParams() == DecodeConfig.of(defaults).sampling
    for values, engine_type in ((dict(max_new_tokens=0), DecodeConfig), (dict(verify="strict"), DecodeConfig),
                                (dict(top_p=0.0), SamplingParams), (dict(seed=-1), SamplingParams)):
        with pytest.raises(SpecdecError) as raised:
            engine_type(**values)
        assert str(raised.value) == _message(values)
    # The server's body names max_new_tokens as OpenAI does, with the same check.
    assert option_forms.body_name("max_new_tokens") == "max_tokens"
    with pytest.raises(SpecdecError, match=r"^max_tokens must be >= 1, got 0$"):
        option_forms.from_body({}, GenerationOptions(max_new_tokens=0))
