"""Streamed text: TextDeltas decodes only a window of new tokens each step, and must still show
exactly what decoding the whole output shows, on every kind of tokenizer decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.text import REPLACEMENT, StopStrings, TextCodec, TextDeltas
from tests.conftest import CORPUS, _tiny_tokenizer

TEXTS = CORPUS + ["naïve café — 日本語のテキスト 🙂🚀 ünïcödé", "def f(x):\n    return x * 2  # don't\n"]


def _sentencepiece_tokenizer():
    """A Llama-2-style tokenizer: Metaspace pieces whose decoder drops the output's first space, and
    byte fallback, where characters outside the vocabulary decode from several byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    sp.train_from_iterator(TEXTS[:4], trainers.BpeTrainer(vocab_size=400, min_frequency=1, show_progress=False,
                                                          special_tokens=["<pad>", "<s>", "</s>", "<unk>", *bytes_]))
    return PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def _clean_up_tokenizer():
    """A WordPiece tokenizer (BERT's), whose decoding joins "##" pieces and rewrites spaces across
    tokens (" ." to ".", " ' s" to "'s"): a window's text need not begin with its known part."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    wp = BertWordPieceTokenizer(lowercase=False)
    wp.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1, show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]", pad_token="[PAD]",
                                   clean_up_tokenization_spaces=True)


TOKENIZERS = {"byte-level BPE": lambda: _tiny_tokenizer(TEXTS, 300), "sentencepiece": _sentencepiece_tokenizer,
              "clean-up spaces": _clean_up_tokenizer}
_made: dict[str, TextCodec] = {}


def _codec(kind: str) -> TextCodec:
    if kind not in _made:
        _made[kind] = TextCodec(TOKENIZERS[kind]())
    return _made[kind]


def _follow(codec: TextCodec, ids: list[int], steps: list[int], stops: list[str]) -> None:
    """Stream ``ids`` in steps of the given sizes: every step's text is the whole output's, and the
    deltas add up to the final text."""
    deltas, shown, end = TextDeltas(codec, StopStrings(stops, codec)), [], 0
    for size in steps:
        end = min(len(ids), end + size)
        if codec.decodes_by_token:
            assert deltas._text_of(ids[:end]) == codec.decode(ids[:end]), ids[:end]
        shown.append(deltas.update(ids[:end], end == len(ids)))
        if end == len(ids):
            break
    else:
        shown.append(deltas.update(ids, True))
    assert "".join(shown) == StopStrings(stops, codec).visible(codec.final_text(ids))


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_streamed_text_is_the_whole_outputs_text_at_every_step(kind, data):
    codec = _codec(kind)
    vocab = len(codec.tokenizer)
    # Real text's tokens (whole characters), random tokens (bytes that do not make characters) and
    # special tokens, in any mix and any step sizes (drafts give several tokens a step).
    text = data.draw(st.sampled_from(TEXTS))
    real = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    start = data.draw(st.integers(0, max(0, len(real) - 1)))
    ids = real[start:start + data.draw(st.integers(1, 40))]
    ids += data.draw(st.lists(st.integers(0, vocab - 1), max_size=12))
    ids = data.draw(st.permutations(ids)) if data.draw(st.booleans()) else ids
    steps = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=60))
    stops = data.draw(st.sampled_from([[], ["o"], [" the", "\n"]]))
    _follow(codec, ids, steps, stops)


def test_only_decoders_that_join_token_texts_decode_a_window():
    assert _codec("byte-level BPE").decodes_by_token and _codec("sentencepiece").decodes_by_token
    assert not _codec("clean-up spaces").decodes_by_token  # "the ' brown" decodes to "the'brown"


def test_a_character_split_over_tokens_is_held_back_until_whole():
    codec = _codec("sentencepiece")
    ids = codec.tokenizer("日本語 🙂", add_special_tokens=False)["input_ids"]
    deltas = TextDeltas(codec, StopStrings([], codec))
    shown = [deltas.update(ids[:n], n == len(ids)) for n in range(1, len(ids) + 1)]
    assert "".join(shown) == codec.decode(ids)
    assert all(REPLACEMENT not in s for s in shown)
    assert len(ids) > len("日本語 🙂")  # byte fallback: the characters did span several tokens


@pytest.mark.real
@pytest.mark.parametrize("alias", ["qwen2.5-coder-1.5b", "gemma3-270m", "smollm2-135m"])
def test_streamed_text_of_real_tokenizers_is_the_whole_outputs_text(alias):
    from transformers import AutoTokenizer

    from specdec.models import resolve

    codec = TextCodec(AutoTokenizer.from_pretrained(resolve(alias, need_hf=False).tokenizer_dir))
    assert codec.decodes_by_token
    text = "".join(TEXTS) + "\n\n```python\nprint('héllo')\n```\n"
    ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    special = codec.tokenizer.all_special_ids[:2]
    ids = ids[:20] + special + ids[20:] + list(range(1000, 1010)) + ids[:5]
    for steps in ([1] * len(ids), [3, 1, 4, 1, 5, 9, 2, 6] * 20):
        _follow(codec, ids, steps, [])
