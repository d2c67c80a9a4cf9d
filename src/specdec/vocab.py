"""A bridge between two vocabularies: text both ways, and the tokens both share.

Two tokenizers rarely spell a token the same way (byte-level BPE writes a leading space as "Ġ",
SentencePiece as "▁", bytes as "<0x0A>"), so each token is first turned into the text it stands
for; tokens that stand for the same text in both vocabularies form the *intersection* (special
tokens and lone bytes of a multi-byte character never do).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property

import torch

from specdec.errors import SpecdecError
from specdec.text import REPLACEMENT, TextCodec

SAMPLE_TEXT = ("Speculative decoding drafts tokens cheaply and verifies them with the target model: "
               "naïve café prices rose 12% — «déjà vu» in 東京, 2024-05-01.\n\tdef f(x): return x ** 2\n")
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_texts(tokenizer, size: int) -> list[str | None]:
    """The text each token id stands for (None: special, unused, or not a whole character)."""
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    byte_level = sum(s.startswith("Ġ") for s in vocab) > sum(s.startswith("▁") for s in vocab)
    table = byte_decoder() if byte_level else {}
    out: list[str | None] = [None] * size
    for piece, i in vocab.items():
        if not 0 <= i < size or i in special:
            continue
        if byte_level:
            try:
                out[i] = bytes(table[c] for c in piece).decode("utf-8")
            except (KeyError, UnicodeDecodeError):
                out[i] = None  # an added token, or part of a character
        else:
            byte = _BYTE_TOKEN.match(piece)
            if byte:
                value = int(byte.group(1), 16)
                out[i] = chr(value) if value < 0x80 else None
            else:
                out[i] = piece.replace("▁", " ")
    return out


class VocabBridge:
    """Moves between a target's and a draft's vocabularies.

    ``target_size`` / ``draft_size`` are the models' logit widths (they may exceed the tokenizers'
    vocabularies). Raises :class:`SpecdecError` when either tokenizer cannot turn text into
    tokens and back, since then no draft could be carried over.
    """

    def __init__(self, target: TextCodec, draft: TextCodec, target_size: int, draft_size: int) -> None:
        self.target, self.draft = target, draft
        self.target_size, self.draft_size = target_size, draft_size
        for codec in (target, draft):
            try:
                ids = codec.tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
                codec.tokenizer.decode(ids)
            except Exception as exc:  # a tokenizer without a text side
                raise SpecdecError(f"cannot bridge the vocabularies of {draft.name} and {target.name}: "
                                   f"{codec.name}'s tokenizer does not turn text into tokens and back ({exc})") from exc
        # What a draft tokenizer puts before any text (e.g. <bos>): its context starts with it.
        self.draft_lead: list[int] = list(draft.tokenizer("")["input_ids"])

    # -- text ----------------------------------------------------------------------------------------
    def text(self, codec: TextCodec, ids: Sequence[int]) -> str:
        return codec.tokenizer.decode(list(ids), skip_special_tokens=True)

    def draft_context(self, target_ids: Sequence[int]) -> list[int]:
        """The draft tokens for the text of ``target_ids`` (re-tokenized as the drafter would)."""
        text = self.text(self.target, target_ids)
        return self.draft_lead + list(self.draft.tokenizer(text, add_special_tokens=False)["input_ids"])

    def continuation(self, target_ids: Sequence[int], text: str, window: int = 2) -> list[int] | None:
        """Target tokens that spell ``text`` right after ``target_ids``.

        Tokenization at the seam can differ from tokenizing the parts apart (a space or a word may
        merge with the token before, a SentencePiece tokenizer prepends a space to any text it
        starts), so the last ``window`` target tokens are re-tokenized together with the new text
        and must come out unchanged, then the result must spell exactly the text; smaller windows
        are tried next. None when the seam falls inside a token (no tokens can continue there
        canonically): the drafter then waits a step.
        """
        tok = self.target.tokenizer
        # Only the seam matters: decode a few tokens before it, not the whole context (this runs
        # every step, and the context keeps growing).
        span = list(target_ids[-(window + 4):])
        full = self.text(self.target, span)
        anchor = span[-4:]
        base = self.text(self.target, anchor)
        for w in range(min(window, len(span)), -1, -1):
            tail = span[len(span) - w:]
            head = self.text(self.target, span[:len(span) - w])
            if not full.startswith(head):
                continue
            ids = list(tok(full[len(head):] + text, add_special_tokens=False)["input_ids"])
            if ids[:w] != tail:
                continue
            new = ids[w:]
            if self.text(self.target, anchor + new) == base + text:
                return new
        return None

    def text_ends(self, codec: TextCodec, context: Sequence[int], new: Sequence[int]) -> list[int]:
        """For each of ``new``, where its text ends, counted from the end of ``context``'s text."""
        anchor = list(context[-4:])
        base = len(self.text(codec, anchor))
        return [len(self.text(codec, anchor + list(new[:i + 1]))) - base for i in range(len(new))]

    # -- the intersection ------------------------------------------------------------------------------
    @cached_property
    def _pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        target_ids = {}
        for i, text in enumerate(token_texts(self.target.tokenizer, self.target_size)):
            if text:
                target_ids.setdefault(text, i)
        draft, target = [], []
        for i, text in enumerate(token_texts(self.draft.tokenizer, self.draft_size)):
            if text and text in target_ids:
                draft.append(i)
                target.append(target_ids[text])
        if not draft:
            raise SpecdecError(f"{self.draft.name} and {self.target.name} share no token: nothing to draft with")
        return torch.tensor(draft), torch.tensor(target)

    @property
    def size(self) -> int:
        """How many draft tokens have a target token with the same text."""
        return len(self._pairs[0])

    @cached_property
    def draft_mask(self) -> torch.Tensor:
        """``[draft_size]`` bool: draft tokens in the intersection."""
        mask = torch.zeros(self.draft_size, dtype=torch.bool)
        mask[self._pairs[0]] = True
        return mask

    @cached_property
    def target_of(self) -> torch.Tensor:
        """``[draft_size]`` long: the target token of each draft token in the intersection (-1 otherwise)."""
        out = torch.full((self.draft_size,), -1, dtype=torch.long)
        out[self._pairs[0]] = self._pairs[1]
        return out

    def to_target(self, q: torch.Tensor) -> torch.Tensor:
        """A draft distribution ``[..., draft_size]`` over the intersection as one over the target's
        vocabulary (draft tokens sharing a target token add up)."""
        draft, target = self._pairs
        out = torch.zeros(*q.shape[:-1], self.target_size, dtype=q.dtype)
        return out.index_add_(-1, target, q[..., draft])

    def target_mass(self, p: torch.Tensor) -> torch.Tensor:
        """The share of target distributions ``[..., target_size]`` inside the intersection."""
        return p[..., self._pairs[1].unique()].sum(-1)

    def round_trip(self, text: str) -> bool:
        """Whether ``text`` tokenized by the draft, decoded, and tokenized by the target equals the
        target's own tokenization (how often re-tokenization is exact)."""
        draft_ids = self.draft.tokenizer(text, add_special_tokens=False)["input_ids"]
        again = self.text(self.draft, draft_ids)
        tok = self.target.tokenizer
        return tok(again, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def has_broken_character(text: str) -> int:
    """Where ``text`` first holds an incomplete character (len(text) when it holds none)."""
    at = text.find(REPLACEMENT)
    return len(text) if at < 0 else at
