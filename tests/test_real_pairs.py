"""Real models drafting for each other across vocabularies (Gemma's 262k tokens, SmolLM2's 49k), and
tree drafts on a real model: greedy output equals plain decoding. Marked ``real``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real

PROMPT = ("Summarize: The city council met on Monday to discuss the new park. The park will have a "
          "playground, a pond and a garden. The council said the park will open in May.")


@pytest.fixture(scope="module")
def models(shared_model):
    """The two models as tests/test_real_models.py loaded them (once for the run)."""
    return {name: shared_model(name, "transformers") for name in ("gemma3-270m", "smollm2-135m")}


@pytest.mark.parametrize("target, draft", [("gemma3-270m", "smollm2-135m"), ("smollm2-135m", "gemma3-270m")])
def test_a_draft_model_with_another_tokenizer_changes_no_greedy_token(models, target, draft):
    t = models[target]
    plain = t.generate(PROMPT, max_new_tokens=24, drafter="none")
    out = t.generate(PROMPT, max_new_tokens=24, drafter="model", draft_model=models[draft], policy="fixed",
                     num_draft=3)
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted > 0  # the drafts crossed the bridge and some were right


def test_tree_drafts_on_a_real_model_change_no_greedy_token(models):
    gemma = models["gemma3-270m"]
    plain = gemma.generate(PROMPT, max_new_tokens=32, drafter="none")
    out = gemma.generate(PROMPT, max_new_tokens=32, drafter="ngram", tree=True, policy="fixed", num_draft=8)
    assert out.token_ids == plain.token_ids
    # A fixed policy verifies only what the index proposes: branched drafts were verified and kept.
    assert out.stats.tree_nodes > 0, "no branched draft was verified"
    assert out.stats.accepted > 0, "no draft token was accepted"
