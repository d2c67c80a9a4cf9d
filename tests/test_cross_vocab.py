"""Drafters with another vocabulary: token texts under both spelling conventions, re-tokenization at
the seam, exactness against plain decoding through text, the intersection sampler's distribution,
and the errors when two vocabularies cannot be bridged."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from conftest import chi_square_pvalue, sequence_distribution
from specdec.backends.toy import ToyLM
from specdec.drafters.base import Drafter
from specdec.drafting.cross import CrossVocabDrafter
from specdec.drafters.model import ModelDrafter
from specdec.engine import DecodeConfig, decode
from specdec.errors import SpecdecError
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams
from specdec.text import TextCodec
from specdec.types import Draft
from specdec.vocab import VocabBridge, token_texts

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there; general kenobi",
         "café naïve déjà 東京 Zürich", "  two  spaces\tand a tab\nnew line", "x=1+2*(3-4)/5."]


def _sentencepiece_tokenizer():
    """A SentencePiece-style tokenizer ("▁" for spaces, Metaspace) trained on other text."""
    from tokenizers import SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(TEXTS * 3 + ["completely different words " * 4], vocab_size=200, min_frequency=1,
                           special_tokens=["<pad>", "<s>", "</s>", "<unk>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def byte_level(tiny_model_dir):
    from transformers import AutoTokenizer

    return TextCodec(AutoTokenizer.from_pretrained(tiny_model_dir), "byte-level")


@pytest.fixture(scope="module")
def sentencepiece():
    return TextCodec(_sentencepiece_tokenizer(), "sentencepiece")


def test_token_texts_read_both_spelling_conventions(byte_level, sentencepiece):
    for codec in (byte_level, sentencepiece):
        tok = codec.tokenizer
        texts = token_texts(tok, len(tok))
        ids = tok(" the quick", add_special_tokens=False)["input_ids"]
        assert "".join(texts[i] for i in ids).strip() == "the quick"
        assert all(texts[i] is None for i in tok.all_special_ids)
    bridge = VocabBridge(byte_level, sentencepiece, len(byte_level.tokenizer), len(sentencepiece.tokenizer))
    assert 0 < bridge.size < len(sentencepiece.tokenizer)
    # every shared pair stands for the same text
    bt, st_ = token_texts(byte_level.tokenizer, 10**6), token_texts(sentencepiece.tokenizer, 10**6)
    for d in bridge.draft_mask.nonzero().flatten().tolist():
        assert st_[d] == bt[int(bridge.target_of[d])]


@settings(max_examples=80, deadline=None)
@given(text=st.sampled_from(TEXTS), cut=st.floats(0.05, 0.95), forward=st.booleans())
def test_text_continues_across_the_seam(byte_level, sentencepiece, text, cut, forward):
    target, draft = (byte_level, sentencepiece) if forward else (sentencepiece, byte_level)
    bridge = VocabBridge(target, draft, len(target.tokenizer), len(draft.tokenizer))
    at = max(1, int(len(text) * cut))
    head = target.tokenizer(text[:at], add_special_tokens=False)["input_ids"]
    new = bridge.continuation(head, text[at:])
    if new is not None:
        # the tokens spell exactly the text after the head, whatever merges happened at the seam
        assert bridge.text(target, head + new) == bridge.text(target, head) + text[at:]
    if text[at - 1] != " " and text[at] == " ":  # a seam between words always goes through
        assert new is not None


# -- exactness through the Model API (two tiny random models with different tokenizers) ----------------
@pytest.fixture(scope="module")
def pair(tiny_model_dir, tiny_other_vocab_dir):
    return specdec.load(str(tiny_model_dir)), specdec.load(str(tiny_other_vocab_dir))


@pytest.mark.parametrize("reverse", [False, True], ids=["a-drafts-for-b", "b-drafts-for-a"])
@pytest.mark.parametrize("drafter", ["model", "staged"])
def test_a_draft_model_with_another_vocabulary_changes_nothing_greedy(pair, reverse, drafter):
    target, draft = pair[::-1] if reverse else pair
    for prompt in ("the quick brown fox", "hello world, café 東京", "zebra yak"):
        plain = target.generate(prompt, max_new_tokens=24, drafter="none")
        out = target.generate(prompt, max_new_tokens=24, drafter=drafter, draft_model=draft, policy="fixed",
                              num_draft=4)
        assert out.token_ids == plain.token_ids
        assert out.stats.drafted > 0  # the bridge carried drafts over


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_seed_gives_the_same_text_through_a_bridge(pair, seed):
    target, draft = pair
    kw = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=seed)
    plain = target.generate("hello there", drafter="none", **kw)
    assert target.generate("hello there", drafter="model", draft_model=draft, **kw).token_ids == plain.token_ids


class TextOracle(Drafter):
    """Drafts, in its own vocabulary, the text the target will write (known in advance)."""

    name = "oracle"

    def __init__(self, codec: TextCodec, text: str) -> None:
        self.codec, self.text = codec, text

    def propose(self, tokens, k, stop=None) -> Draft:
        so_far = self.codec.tokenizer.decode(list(tokens), skip_special_tokens=True)
        rest = self.text[len(so_far):] if self.text.startswith(so_far) else ""
        ids = self.codec.tokenizer(rest, add_special_tokens=False)["input_ids"][:k]
        return Draft(ids, confidence=[0.9] * len(ids))


def test_a_right_drafter_in_another_vocabulary_is_mostly_accepted(byte_level, sentencepiece):
    """The bridge loses little at the seam: a drafter that knows the text gets most of it accepted.

    The target is a stand-in that writes a fixed text (its tokens: the canonical tokenization)."""
    text = " ".join(TEXTS[:2] + TEXTS[:2])
    target_ids = sentencepiece.tokenizer(text, add_special_tokens=False)["input_ids"]
    V = len(sentencepiece.tokenizer)
    prompt, reference = target_ids[:3], target_ids[3:]
    table = torch.full((1, V), -10.0)

    class Scripted(ToyLM):  # the next token of the reference, whatever the context
        def logits(self, context):
            row = table[0].clone()
            row[(target_ids + [0])[len(context)]] = 10.0
            return row

    lm = Scripted(V, 0, table=table)
    bridge = VocabBridge(sentencepiece, byte_level, V, len(byte_level.tokenizer))
    drafter = CrossVocabDrafter(TextOracle(byte_level, bridge.text(sentencepiece, target_ids)), bridge,
                                frozenset(), frozenset())
    out = decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=len(reference)), drafter, FixedK(6))
    assert out.token_ids == reference
    # Each step holds back the last token when its word may go on, so not everything is drafted.
    assert out.stats.accepted >= 0.5 * len(reference)
    assert out.stats.mean_accepted_length > 2.0


class Reserving(TextOracle):
    """A :class:`TextOracle` that records what :meth:`~specdec.drafters.base.Drafter.reserve` asks of it."""

    def __init__(self, codec: TextCodec, text: str) -> None:
        super().__init__(codec, text)
        self.reserved: list[int] = []

    def reserve(self, tokens, cancelled=None) -> None:
        self.reserved.append(tokens)


def test_the_wrapper_passes_reserve_on_in_the_inner_vocabulary(byte_level, sentencepiece):
    """A draft model with a fixed-size cache (a GPU batch's pages) takes it at reserve: through the
    bridge it must still be asked, for its own prompt's tokens and the answer's."""
    text = " ".join(TEXTS)
    target_ids = sentencepiece.tokenizer(text, add_special_tokens=False)["input_ids"]
    V = len(sentencepiece.tokenizer)
    lm = ToyLM(V, 1, seed=3)
    bridge = VocabBridge(sentencepiece, byte_level, V, len(byte_level.tokenizer))
    inner = Reserving(byte_level, text)
    prompt = target_ids[:12]
    decode(lm.backend(), prompt, DecodeConfig(max_new_tokens=8), CrossVocabDrafter(inner, bridge, frozenset(),
                                                                                      frozenset()), FixedK(4))
    assert len(inner.reserved) == 1
    # Its prompt's own tokens (more here than the target's), and the answer's at least one for one.
    assert len(bridge.draft_context(prompt)) > len(prompt)
    assert inner.reserved[0] >= len(bridge.draft_context(prompt)) + 8


# -- the intersection sampler ------------------------------------------------------------------------
class FakeBridge:
    """Target vocabulary {0..3}; draft vocabulary {0..4} where draft 0..2 are target 0..2 and draft
    3, 4 have no target twin (target 3 has none either)."""

    draft_mask = torch.tensor([True, True, True, False, False])
    target_of = torch.tensor([0, 1, 2, -1, -1])

    def draft_context(self, ids):
        return [t if t < 3 else 4 for t in ids]

    def to_target(self, q):
        out = torch.zeros(*q.shape[:-1], 4)
        out[..., :3] = q[..., :3]
        return out


TARGET = ToyLM(4, 1, seed=21, scale=1.5)
DRAFT = ToyLM(5, 1, seed=22, scale=1.5)


def _intersection_counts(bridge) -> tuple[Counter, int]:
    counts, accepted = Counter(), 0
    for seed in range(2500):
        cfg = DecodeConfig(max_new_tokens=3, verify="rejection", sampling=SamplingParams(1.0, seed=seed))
        drafter = CrossVocabDrafter(ModelDrafter(DRAFT.backend()), bridge, frozenset(), frozenset())
        out = decode(TARGET.backend(), [1], cfg, drafter, FixedK(3))
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
    return counts, accepted


def _exact() -> dict:
    return sequence_distribution(TARGET, [1], 3, SamplingParams(1.0))


def test_the_intersection_sampler_keeps_the_targets_distribution():
    counts, accepted = _intersection_counts(FakeBridge())
    assert accepted > 1000  # drafts were accepted, so the test exercised the rule
    assert chi_square_pvalue(counts, _exact()) > 1e-3


class Miswired(FakeBridge):
    """Broken: token 0 and 1 are swapped in q but not in the token map (a wrong mapping)."""

    def to_target(self, q):
        out = super().to_target(q)
        return out[..., [1, 0, 2, 3]]


def test_the_intersection_test_catches_a_broken_bridge():
    counts, _ = _intersection_counts(Miswired())
    assert chi_square_pvalue(counts, _exact()) < 1e-6


# -- the report and bad input ------------------------------------------------------------------------
def test_vocab_command_reports_the_bridge(capsys, tmp_path, tiny_model_dir, tiny_other_vocab_dir):
    from specdec.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps({"question_id": i, "category": "c", "turns": [t]})
                                   for i, t in enumerate(TEXTS)))
    assert main(["vocab", "--model", str(tiny_model_dir), "--draft-model", str(tiny_other_vocab_dir), "--json",
                 "--questions", str(questions), "--mass"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 5 + len(TEXTS)
    assert 0.0 < report["target_mass_shared"] <= 1.0
    assert report["target_vocab"] > 0 and report["draft_vocab"] > 0
    assert 0 < report["intersection"] <= min(report["target_vocab"], report["draft_vocab"])
    assert 0.0 <= report["round_trip"] <= 1.0 and report["same_vocabulary"] is False
    assert main(["vocab", "--model", str(tiny_model_dir), "--draft-model", str(tiny_model_dir), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["same_vocabulary"] is True and same["round_trip"] == 1.0


def test_vocabularies_that_share_nothing_are_refused(byte_level):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"<unk>": 0, "zzqx": 1}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    odd = TextCodec(PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>"), "odd")
    bridge = VocabBridge(byte_level, odd, len(byte_level.tokenizer), 2)
    with pytest.raises(SpecdecError, match="share no token"):
        bridge.draft_mask


def test_a_tokenizer_without_a_text_side_is_refused(byte_level):
    class NoText:
        def __call__(self, *args, **kwargs):
            raise NotImplementedError("no encoder")

    with pytest.raises(SpecdecError, match="cannot bridge"):
        VocabBridge(byte_level, TextCodec(NoText(), "broken"), 10, 10)
