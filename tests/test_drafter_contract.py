"""The drafter interface is what the engine calls, and no more: a drafter written against those
hooks alone runs through :meth:`specdec.Model.generate`, its drafts verified, with plain decoding's
greedy tokens; and each hook is called at the moment its name says."""

from __future__ import annotations

from specdec.drafting.drafter import Drafter
from specdec.types import Draft

HOOKS = {"begin", "reserve", "token_cost", "propose", "verified", "close"}


def test_the_drafter_interface_has_exactly_the_hooks_the_engine_calls():
    hooks = {name for name, value in vars(Drafter).items() if callable(value) and not name.startswith("_")}
    assert hooks == HOOKS


class Recording(Drafter):
    """Drafts plain decoding's continuation (``reference``), one token of it wrong where the context
    length is a multiple of 3, and records every call the engine makes."""

    name = "recording"

    def __init__(self, reference: list[int], vocab_size: int) -> None:
        self.reference, self.vocab_size = reference, vocab_size
        self.calls: list[tuple] = []

    def begin(self, prompt, sampler, target=None) -> None:
        super().begin(prompt, sampler, target)
        self.calls.append(("begin", len(prompt), target is not None))

    def reserve(self, tokens, cancelled=None) -> None:
        self.calls.append(("reserve", tokens))

    def token_cost(self, tokens=()) -> float:
        self.calls.append(("token_cost", len(tokens)))
        return 0.0

    def propose(self, tokens, k, stop=None) -> Draft:
        self.calls.append(("propose", len(tokens)))
        nxt = self.reference[len(tokens):len(tokens) + k]
        if len(tokens) % 3 == 0 and len(nxt) > 1:
            nxt[1] = (nxt[1] + 1) % self.vocab_size
        return Draft(nxt)

    def verified(self, draft, verdict, fed=(), logits=None) -> None:
        self.calls.append(("verified", list(draft.tokens), verdict.num_accepted, list(fed), logits.shape[0]))

    def close(self) -> None:
        self.calls.append(("close",))


def test_a_drafter_of_only_these_hooks_runs_through_generate_with_plain_greedy_tokens(tiny):
    prompt = "the quick brown fox"
    plain = tiny.generate(prompt, max_new_tokens=24, drafter="none")
    drafter = Recording(plain.prompt_ids + plain.token_ids, tiny.loaded.backend().vocab_size)
    spec = tiny.generate(prompt, max_new_tokens=24, drafter=drafter, policy="fixed", num_draft=3)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0 and spec.stats.drafted > spec.stats.accepted  # drafts verified, some wrong
    calls = drafter.calls
    assert calls[0] == ("begin", len(plain.prompt_ids), True) and calls[-1] == ("close",)
    assert calls[1] == ("reserve", len(plain.prompt_ids) + 24)  # what the generation will hold at most
    # Per step: the price, the draft (none where only the target's own token is left to make),
    # then what verification made of it with the target's rows after the fed tokens.
    steps = [call for call in calls if call[0] == "verified"]
    assert len(steps) == len(spec.trace) == sum(call[0] == "token_cost" for call in calls)
    context = len(plain.prompt_ids)
    i = 2
    for step, (_, drafted, accepted, fed, rows) in zip(spec.trace, steps):
        assert calls[i] == ("token_cost", context)
        i += 1
        if calls[i][0] == "propose":
            assert calls[i] == ("propose", context)
            i += 1
        assert calls[i][0] == "verified" and drafted == step.drafted and accepted == step.accepted
        assert fed[1:] == drafted and rows == len(fed)
        i += 1
        context += len(step.emitted)
    assert i == len(calls) - 1


def test_what_a_registered_drafter_or_policy_does_is_a_property_of_its_entry_not_its_name():
    """Plain decoding is the drafter that does not draft, and the adaptive policy the one that reads
    the cost curve: a drafter registered under a new name drafts and is a bench method unedited."""
    from specdec.bench.methods import method_forms
    from specdec.drafters.base import NoDrafter
    from specdec.registry import DRAFTERS, POLICIES, drafter

    assert [entry.name for entry in DRAFTERS if not entry.drafts] == ["none"] and not NoDrafter().drafts
    assert [entry.name for entry in POLICIES if entry.uses_costs] == ["adaptive"]
    drafter("contract-test", "a test drafter")(lambda request: Recording([], 1))
    try:
        assert DRAFTERS.get("contract-test").drafts and Recording([], 1).drafts
        assert any(form.startswith("contract-test[") for form in method_forms())
    finally:
        DRAFTERS.remove("contract-test")
