"""Constrained decoding (specdec.constraints): the target's distribution masked to a grammar at
every position, drafts cut where the grammar forbids them, its forced tokens drafted.

Exactness: greedy constrained output with any drafter is plain constrained decoding's, token for
token, on the tiny transformers model and on llama.cpp (SmolLM2, exact kernels), with drafts
verified (the grammar's and the drafter's) and counted. Sampling: on a toy target of 4 tokens with
a rule-based constraint (the engine asks a constraint only for masks, forced tokens, the allowed
prefix of a draft and to consume what was chosen), the sampled sequences follow the masked target
distribution (chi-square over all 3-token outcomes, enumerated), with speculation too, and the
test catches an engine that forgets the mask. Bad schemas, expressions and grammars are refused
with the grammar engine's message.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import chi_square_pvalue
from specdec.backends.toy import ToyLM
from specdec.constraints import ForcedRun, spec_of
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, DecodeRun
from specdec.errors import SpecdecError
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams, logits_to_probs

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def _valid_person(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "tags"} and isinstance(value["name"], str)
            and isinstance(value["age"], int) and all(isinstance(t, str) for t in value["tags"]))


def _grammar_steps(out) -> tuple[int, int, int]:
    """The grammar's forced tokens verified (the steps that reached them), those kept, and the
    drafter's tokens verified in the same drafts (before or after them)."""
    drafted = kept = joined = 0
    for step in out.trace:
        span = (step.extra or {}).get("certain")
        if span is None:
            continue
        start, stop = span
        joined += len(step.drafted) - (stop - start)
        if step.accepted >= start:
            drafted += stop - start
            kept += max(0, min(step.accepted, stop) - start)
    return drafted, kept, joined


# -- the tiny transformers model -------------------------------------------------------------------

@pytest.mark.parametrize("constraint", [
    {"response_format": PERSON},
    {"regex": r"(yes|no), because [a-z ]{3,20}\."},
    {"grammar": 'start: "The " ("quick" | "lazy") " " ("fox" | "dog") " jumps" /[ a-z]{0,12}/ "."'},
], ids=["json-schema", "regex", "lark"])
def test_constrained_greedy_with_drafts_equals_plain_constrained_decoding(tiny, constraint):
    prompt = "the quick brown fox jumps over the lazy dog. the quick brown fox"
    plain = tiny.generate(prompt, max_new_tokens=60, drafter="none", **constraint)
    joins = []
    for drafter in ("ngram", "recycle"):
        out = tiny.generate(prompt, max_new_tokens=60, drafter=drafter, policy="fixed", num_draft=6,
                            trace=True, **constraint)
        assert out.token_ids == plain.token_ids, drafter
        drafted, accepted, joined = _grammar_steps(out)
        assert out.stats.drafted > 0 and out.stats.target_forwards < len(out.token_ids)
        assert drafted > 0 and accepted == drafted  # the grammar's forced tokens: drafted, all kept
        joins.append(joined)
    if "response_format" not in constraint:  # the n-gram drafter's tokens joined the grammar's
        assert joins[0] > 0
    if "response_format" in constraint and plain.finish_reason == "eos":
        assert _valid_person(plain.text)
    if "regex" in constraint and plain.finish_reason == "eos":
        assert re.fullmatch(constraint["regex"], plain.text)


BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                            "age": {"type": "integer", "maximum": 120, "minimum": 0},
                                            "tags": {"type": "array", "maxItems": 2,
                                                     "items": {"type": "string", "maxLength": 4}}},
           "required": ["name", "age", "tags"], "additionalProperties": False,
           "x-guidance": {"whitespace_flexible": False}}  # llguidance's option: no whitespace to wander in


def test_a_finished_answer_is_valid_and_ends_at_the_end_of_sequence(tiny):
    """A random model under a schema whose every string, list and number is bounded, without free
    whitespace: the grammar ends, and the only token then allowed ends the sequence."""
    out = tiny.generate("zebra", max_new_tokens=300, response_format=BOUNDED, drafter="ngram")
    assert out.finish_reason == "eos" and _valid_person(out.text)
    out = tiny.generate("zebra", max_new_tokens=40, regex=r"[0-9]{3}-[0-9]{4}")
    assert out.finish_reason == "eos" and re.fullmatch(r"[0-9]{3}-[0-9]{4}", out.text)


def test_json_answers_are_one_line_with_json_dumps_separators_unless_the_schema_says(tiny):
    """The default layout forces what lies between a value and the next key: the same object
    written by json.dumps is allowed whole, pretty-printed it is cut at the first newline; a schema
    that sets its own layout (llguidance's x-guidance) gets it."""
    from specdec.constraints import spec_of

    value = {"name": "ab", "age": 3, "tags": ["x"]}
    compact, pretty = json.dumps(value), json.dumps(value, indent=2)

    def allowed(schema, text):
        constraint = tiny.loaded.grammar(spec_of(schema)).start()
        tokens = tiny.encode(text)
        return tiny.decode(tokens[:constraint.allowed_prefix(tokens)])

    assert allowed(PERSON, compact) == compact
    assert allowed(PERSON, pretty) == "{"
    flexible = {**PERSON, "x-guidance": {"whitespace_flexible": True}}
    assert allowed(flexible, pretty) == pretty
    assert allowed({"type": "json_object"}, compact) == compact


def test_a_forced_run_costs_one_forward(tiny):
    """A regex whose first 24 characters are fixed: with a drafter, the grammar's tokens for them
    are verified in the first forward, where plain constrained decoding spends a forward each."""
    regex = r"The answer is, in short: [0-9]{2}"
    plain = tiny.generate("zebra", max_new_tokens=30, regex=regex, drafter="none", trace=True)
    out = tiny.generate("zebra", max_new_tokens=30, regex=regex, drafter="ngram", policy="fixed", num_draft=32,
                        trace=True)
    assert out.token_ids == plain.token_ids
    forced = len(tiny.encode("The answer is, in short:"))
    first = out.trace[0]
    assert (first.extra or {}).get("source") == "grammar" and first.accepted >= forced - 1
    assert plain.stats.target_forwards == len(plain.token_ids)
    assert out.stats.target_forwards <= len(out.token_ids) - (forced - 1)


def test_sampled_constrained_output_replays_with_speculation_on_and_off(tiny):
    kwargs = dict(max_new_tokens=40, temperature=0.9, seed=11, response_format=PERSON)
    plain = tiny.generate("the quick brown fox", drafter="none", **kwargs)
    for drafter in ("ngram", "recycle"):
        assert tiny.generate("the quick brown fox", drafter=drafter, **kwargs).token_ids == plain.token_ids


@pytest.mark.parametrize("kwargs, words", [
    ({"regex": "[unclosed"}, "unclosed character class"),
    ({"response_format": {"type": "object", "properties": {"a": {"type": "frob"}}}}, "frob"),
    ({"response_format": "{not json"}, "not valid JSON"),
    ({"response_format": [1, 2]}, "must be an object"),
    ({"grammar": "start: undefined_rule"}, "undefined_rule"),
    ({"grammar": "root ::= [a-z"}, "GBNF"),
    ({"regex": "a+", "grammar": "start: \"a\""}, "give one constraint"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "must carry a schema"),
])
def test_bad_constraints_are_refused_with_the_engines_message(tiny, kwargs, words):
    with pytest.raises(SpecdecError, match=re.escape(words)):
        tiny.generate("hello", max_new_tokens=4, **kwargs)


def test_openai_forms_and_pydantic_models_give_the_same_constraint():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    schema = Person.model_json_schema()
    wrapped = spec_of({"type": "json_schema", "json_schema": {"name": "Person", "schema": schema, "strict": True}})
    assert spec_of(Person) == spec_of(schema) == spec_of(json.dumps(schema)) == wrapped
    assert spec_of({"type": "json_object"}).kind == "json_object" and spec_of({"type": "text"}) is None
    assert spec_of(grammar='root ::= "a"').kind == "gbnf" and spec_of(grammar='start: "a"').kind == "lark"


# -- llama.cpp, a real model -------------------------------------------------------------------

@pytest.mark.real
def test_constrained_greedy_on_llamacpp_equals_plain_constrained_decoding(shared_model):
    pytest.importorskip("llama_cpp")
    model = shared_model("smollm2-135m", "llamacpp")
    prompt = "Give me a JSON object describing a person named Ada who is 36 and likes chess and tea."
    plain = model.generate(prompt, chat=True, max_new_tokens=80, drafter="none", response_format=BOUNDED)
    assert plain.finish_reason == "eos" and _valid_person(plain.text)
    out = model.generate(prompt, chat=True, max_new_tokens=80, drafter="ngram", policy="fixed", num_draft=8,
                         response_format=BOUNDED, trace=True)
    assert out.token_ids == plain.token_ids
    assert _grammar_steps(out)[0] > 0 and out.stats.target_forwards < plain.stats.target_forwards
    # The forced text's last token (` "` after a key) is drafted as likely, and kept
    likely = [step for step in out.trace if "likely" in (step.extra or {})]
    assert any(step.accepted >= step.extra["likely"][1] for step in likely)


@pytest.mark.real
def test_the_forced_texts_last_token_is_likely_not_certain_on_a_real_tokenizer(shared_model):
    """llguidance forces bytes; its fast-forward tokens stop where the next token could merge with
    what follows (` "` could be ` "$`). The rest of the forced text's canonical tokenization is the
    likely part: together they spell the forced text."""
    pytest.importorskip("llama_cpp")
    model = shared_model("smollm2-135m", "llamacpp")
    constraint = model.loaded.grammar(spec_of(PERSON)).start()
    run = constraint.forced()
    assert model.decode(run.certain) == '{"name":' and model.decode(run.likely) == ' "'
    after_key = constraint.forced(model.encode('{"name": "Ada", "age": 36, "tags":'))
    assert after_key.certain == [] and model.decode(after_key.likely) == " ["


# -- the masked distribution, on a toy target --------------------------------------------------

V, LENGTH, SAMPLES = 4, 3, 6000
PROMPT = [0, 1, 0, 1, 2]
TARGET = ToyLM(V, 1, seed=21, scale=1.2)
DRAFT = ToyLM(V, 1, seed=99, scale=1.5)


def _allowed(context: list[int]) -> list[int]:
    """The toy grammar: never the previous token again, and after a 3 only a 0 (forced)."""
    last = context[-1]
    return [0] if last == 3 else [t for t in range(V) if t != last]


class RuleConstraint:
    """A constraint as the engine uses one (specdec.constraints.Constraint's methods), from
    :func:`_allowed` over the whole context."""

    def __init__(self, prompt: list[int]) -> None:
        self.context = list(prompt)

    def allowed(self, context: list[int]) -> list[int]:
        return _allowed(context)

    def forced(self, after=()) -> ForcedRun:
        out, ctx = [], [*self.context, *after]
        while len(allowed := self.allowed(ctx)) == 1 and len(out) < 4:
            out.append(allowed[0])
            ctx.append(allowed[0])
        return ForcedRun(out, [])

    def allowed_prefix(self, tokens) -> int:
        ctx = list(self.context)
        for i, t in enumerate(tokens):
            if t not in self.allowed(ctx):
                return i
            ctx.append(t)
        return len(tokens)

    def masks(self, tokens) -> np.ndarray:
        rows, ctx = [], list(self.context)
        for t in [*tokens, None]:
            row = np.zeros(V, dtype=bool)
            row[self.allowed(ctx)] = True
            rows.append(row)
            ctx.append(t)
        return np.stack(rows)

    def consume(self, tokens) -> None:
        self.context.extend(tokens)

    def only_token(self) -> int | None:  # the toy grammar never ends
        return None


def _masked_distribution(params: SamplingParams) -> dict[tuple[int, ...], float]:
    dist = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        ctx, prob = list(PROMPT), 1.0
        for tok in seq:
            logits = TARGET.logits(ctx).clone()
            logits[[t for t in range(V) if t not in _allowed(ctx)]] = float("-inf")
            prob *= float(logits_to_probs(logits, params)[tok])
            ctx.append(tok)
        dist[seq] = prob
    return dist


def _sample(params: SamplingParams, drafter_factory, mode: str = "coupled", constraint=RuleConstraint) -> Counter:
    counts: Counter = Counter()
    for i in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=LENGTH, verify=mode,
                           sampling=SamplingParams(params.temperature, params.top_k, params.top_p, seed=i))
        run = DecodeRun(TARGET.backend(), PROMPT, cfg, drafter_factory(), FixedK(2),
                        constraint=constraint(PROMPT) if constraint else None)
        counts[tuple(run.run().token_ids)] += 1
    return counts


MASKED_CASES = [(SamplingParams(1.0), "none", "coupled"), (SamplingParams(0.8, top_k=2), "model", "coupled"),
                (SamplingParams(1.2, top_p=0.9), "model", "rejection"), (SamplingParams(1.0), "ngram", "coupled")]
FACTORIES = {"none": lambda: None, "model": lambda: ModelDrafter(DRAFT.backend()),
             "ngram": lambda: NgramDrafter(max_ngram=2, min_ngram=1)}


@pytest.mark.parametrize("params, drafter, mode", MASKED_CASES,
                         ids=[f"{d}-{m}-T{p.temperature}" for p, d, m in MASKED_CASES])
def test_sampled_constrained_sequences_follow_the_masked_target_distribution(params, drafter, mode):
    counts = _sample(params, FACTORIES[drafter], mode)
    assert all(_is_allowed(seq) for seq in counts)
    pvalue = chi_square_pvalue(counts, _masked_distribution(params))
    assert pvalue > 1e-3, f"sampled distribution differs from the masked target's (p={pvalue:.2e})"


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_sampled_sequences_with_likely_tokens_drafted_follow_the_masked_target_distribution(drafter):
    counts = _sample(SamplingParams(1.0), FACTORIES[drafter], constraint=_LikelyRule)
    assert all(_is_allowed(seq) for seq in counts)
    pvalue = chi_square_pvalue(counts, _masked_distribution(SamplingParams(1.0)))
    assert pvalue > 1e-3, f"sampled distribution differs from the masked target's (p={pvalue:.2e})"


def _is_allowed(seq: tuple[int, ...]) -> bool:
    ctx = list(PROMPT)
    for t in seq:
        if t not in _allowed(ctx):
            return False
        ctx.append(t)
    return True


def test_the_masked_distribution_test_catches_an_engine_that_forgets_the_mask(monkeypatch):
    """The negative control: logits left unmasked give sequences the grammar forbids, and the
    chi-square test rejects them."""
    import specdec.engine

    monkeypatch.setattr(specdec.engine.constraints, "apply", lambda logits, masks: logits)
    counts = _sample(SamplingParams(1.0), FACTORIES["model"], constraint=_NoForcing)
    assert not all(_is_allowed(seq) for seq in counts)
    assert chi_square_pvalue(counts, _masked_distribution(SamplingParams(1.0))) < 1e-6


class _NoForcing(RuleConstraint):
    """The rule constraint without forced tokens or draft cuts (the mask alone keeps it)."""

    def forced(self, after=()) -> ForcedRun:
        return ForcedRun([], [])

    def allowed_prefix(self, tokens) -> int:
        return len(tokens)


class _Threes:
    """A drafter that always proposes [3, 1, 2] (the toy grammar forces a 0 after each 3) and
    records what it is told after each verification."""

    name, drafts, sampler = "threes", True, None

    def __init__(self) -> None:
        self.told: list[tuple[list[int], int, bool, list[int], int]] = []
        self.contexts: list[list[int]] = []

    def begin(self, prompt, sampler, target=None) -> None:
        pass

    def reserve(self, tokens, cancelled=None) -> None:
        pass

    def token_cost(self, tokens=()) -> float:
        return 0.0

    def propose(self, tokens, k, stop=None):
        from specdec.types import Draft

        self.contexts.append(list(tokens))
        return Draft([3, 1, 2][:k], confidence=[0.9, 0.9, 0.9][:k])

    def verified(self, draft, verdict, fed=(), logits=None) -> None:
        self.told.append((list(draft.tokens), verdict.num_accepted, verdict.bonus, list(fed),
                          0 if logits is None else logits.shape[0]))

    def close(self) -> None:
        pass


def test_forced_tokens_and_the_drafters_share_a_draft_and_the_drafter_hears_of_its_own():
    """Greedy, the toy grammar (no token twice in a row, and only a 0 after a 3): the drafter's
    [3, 1, 2] is cut to [3] and the forced 0 joins it; a forced 0 is followed by the drafter's
    tokens proposed after it. The output is plain constrained decoding's; the drafter is told only
    about its own tokens, each verdict counted from its own first token, with the logits' rows
    that follow them."""
    cfg = DecodeConfig(max_new_tokens=12)
    plain = DecodeRun(TARGET.backend(), PROMPT, cfg, None, FixedK(1), constraint=RuleConstraint(PROMPT)).run()
    drafter = _Threes()
    run = DecodeRun(TARGET.backend(), PROMPT, cfg, drafter, FixedK(4), constraint=RuleConstraint(PROMPT))
    out = run.run()
    assert out.token_ids == plain.token_ids
    spans = [(step.extra or {}).get("certain") for step in out.trace]
    after_forced = [s for s, step in zip(spans, out.trace) if s and s[0] == 0 and len(step.drafted) > s[1]]
    before_forced = [s for s in spans if s and s[0] > 0]
    assert after_forced and before_forced
    for tokens, accepted, bonus, fed, rows in drafter.told:
        if tokens:
            assert tokens == [3, 1, 2][:len(tokens)] and accepted <= len(tokens)
            assert len(fed) == len(tokens) + 1 == rows and fed[1:] == tokens
            assert bonus == (accepted == len(tokens))
        else:
            assert len(fed) == 1 == rows


class _LikelyRule(RuleConstraint):
    """The rule constraint whose forced runs end with a likely token: a 2 after a 0 or a 1
    (allowed, not always the target's choice), also where nothing is certain."""

    def forced(self, after=()) -> ForcedRun:
        certain = super().forced(after).certain
        ctx = [*self.context, *after, *certain]
        return ForcedRun(certain, [2] if ctx[-1] in (0, 1) else [])


def test_likely_tokens_join_the_draft_and_the_output_is_plain_constrained_decodings():
    """Sampled under the toy grammar with likely tokens (the same seed with and without drafts):
    drafted after the certain ones, or alone before a free drafter's, marked in the trace, kept
    where the target agrees, and the output is plain constrained decoding's token for token."""
    likely, learned = [], []
    for seed in range(6):
        cfg = DecodeConfig(max_new_tokens=30, sampling=SamplingParams(1.0, seed=seed))
        plain = DecodeRun(TARGET.backend(), PROMPT, cfg, None, FixedK(1), constraint=_LikelyRule(PROMPT)).run()
        run = DecodeRun(TARGET.backend(), PROMPT, cfg, _Threes(), FixedK(4), constraint=_LikelyRule(PROMPT))
        out = run.run()
        assert out.token_ids == plain.token_ids
        steps = [step for step in out.trace if "likely" in (step.extra or {})]
        likely += steps
        kept = sum(1 for s in steps if s.accepted > s.extra["likely"][0])
        tried = sum(1 for s in steps if s.accepted >= s.extra["likely"][0])
        assert run._likely.kept == 4 + kept and run._likely.tried == 5 + tried
        learned.append((kept, tried))
    assert [s for s in likely if "certain" in s.extra] and [s for s in likely if s.extra["likely"][0] == 0]
    assert all(step.drafted[step.extra["likely"][0]] == 2 for step in likely)
    kept, tried = map(sum, zip(*learned))
    assert 0 < kept < tried  # both outcomes seen


def test_the_likely_rate_counts_the_tokens_verification_reached():
    from specdec.engine import LikelyRate

    rate = LikelyRate()
    assert rate.rate == 0.8
    rate.learn(2, 4, accepted=6)  # both kept
    rate.learn(2, 4, accepted=2)  # the first reached and rejected
    rate.learn(2, 4, accepted=1)  # not reached: rejected before them
    assert (rate.kept, rate.tried) == (6, 8)


class _Ending(RuleConstraint):
    """A grammar that ends after 5 new tokens, then allows only the end of sequence (3, never
    allowed before); before, any token but the last one. Nothing is forced."""

    EOS = 3

    def __init__(self, prompt: list[int]) -> None:
        super().__init__(prompt)
        self.start = len(prompt)

    def allowed(self, context: list[int]) -> list[int]:
        if len(context) - self.start >= 5:
            return [self.EOS]
        return [t for t in range(V) if t not in (context[-1], self.EOS)]

    def forced(self, after=()) -> ForcedRun:
        return ForcedRun([], [])

    def only_token(self) -> int | None:
        return self.EOS if len(self.context) - self.start >= 5 else None


class _Silent(_Threes):
    """A drafter that drafts, and never has a token to offer: every step is a plain one."""

    def propose(self, tokens, k, stop=None):
        from specdec.types import Draft

        return Draft([])


def test_the_end_of_sequence_after_a_finished_grammar_costs_no_forward_with_drafts():
    """Once the grammar has ended, the end of sequence is all the masked distribution holds, so a
    speculative run emits it without a forward (a step of 0 target forwards); plain decoding, the
    baseline, and a run that reports log-probabilities take theirs. The tokens are the same."""
    cfg = DecodeConfig(max_new_tokens=20, eos_token_ids=frozenset({_Ending.EOS}))
    plain = DecodeRun(TARGET.backend(), PROMPT, cfg, None, FixedK(1), constraint=_Ending(PROMPT)).run()
    out = DecodeRun(TARGET.backend(), PROMPT, cfg, _Silent(), FixedK(4), constraint=_Ending(PROMPT)).run()
    assert out.token_ids == plain.token_ids and len(out.token_ids) == 6 and out.token_ids[-1] == _Ending.EOS
    assert out.finish_reason == plain.finish_reason == "eos"
    assert [s.target_forwards for s in out.trace] == [1] * 5 + [0] and out.stats.target_forwards == 5
    assert plain.stats.target_forwards == 6
    scored_cfg = DecodeConfig(max_new_tokens=20, eos_token_ids=frozenset({_Ending.EOS}), logprobs=1)
    scored = DecodeRun(TARGET.backend(), PROMPT, scored_cfg, _Silent(), FixedK(4), constraint=_Ending(PROMPT)).run()
    assert scored.token_ids == plain.token_ids and scored.stats.target_forwards == 6
    assert len(scored.logprobs) == 6


def test_masked_logits_keep_only_allowed_tokens():
    from specdec.constraints import apply

    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    masks = np.array([[True, False, True, False], [False, False, False, True]])
    out = apply(logits, masks)
    assert out[0].argmax() == 2 and out[1].argmax() == 3 and torch.isinf(out[0, 1]) and logits[0, 1] == 2.0


@pytest.mark.real
def test_the_openai_sdks_parse_against_the_server_on_a_real_model(shared_model):
    """The openai SDK's ``chat.completions.parse`` with a pydantic model, whole and streamed
    (``chat.completions.stream``), unchanged, against ``specdec serve`` on SmolLM2 (llama.cpp):
    the parsed answer is the model's, and equals the same request's ``generate``."""
    pytest.importorskip("llama_cpp")
    openai = pytest.importorskip("openai")
    pydantic = pytest.importorskip("pydantic")

    from conftest import serving
    from specdec.server.app import ServeConfig, Server

    class Person(pydantic.BaseModel):
        name: str
        age: int

    model = shared_model("smollm2-135m", "llamacpp")
    question = "Describe a person named Ada who is 36 as JSON."
    server = Server(model, config=ServeConfig(slots=2))
    with serving(server.app(), timeout=60) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": question}]
        reply = client.chat.completions.parse(model=model.name, messages=messages, response_format=Person,
                                              temperature=0, max_tokens=60)
        parsed = reply.choices[0].message.parsed
        assert isinstance(parsed, Person) and parsed.name
        with client.chat.completions.stream(model=model.name, messages=messages, response_format=Person,
                                            temperature=0, max_tokens=60) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].message.parsed == parsed
    schema = openai.lib._pydantic.to_strict_json_schema(Person)
    expected = model.generate(question, chat=True, max_new_tokens=60, response_format=schema)
    assert reply.choices[0].message.content == expected.text
