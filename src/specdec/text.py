"""Text in and out: prompts to token ids (optionally through a chat template), ids to text, stop
strings, and what part of a growing text is safe to show while streaming."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from specdec.errors import SpecdecError

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to
# The tokenizers decoders whose output is each token's text joined, edited only at a token's edges
# (a sequence's first space, bytes fused into characters).
TOKENWISE_DECODERS = frozenset({"ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"})
# How far from a text's end a clean-up of spaces can still change it once more tokens follow:
# its rules (" ." to ".", " ' " to "'", " n't" to "n't", ...) drop a space at most 3 characters
# before the end of a match, which is not complete yet.
CLEAN_UP_REACH = 3


class TextCodec:
    """A tokenizer as specdec uses it (any transformers tokenizer)."""

    def __init__(self, tokenizer, name: str = "model") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self._vocab: dict[str, int] | None = None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def vocab(self) -> dict[str, int]:
        if self._vocab is None:
            self._vocab = self.tokenizer.get_vocab()
        return self._vocab

    @functools.cached_property
    def decodes_by_token(self) -> bool:
        """Whether a text decodes as its tokens' texts joined, with edits only inside a token's
        neighbourhood (byte-level BPE, SentencePiece's metaspace and byte fallback), so a stream can
        decode its new tokens alone (:class:`TextDeltas`). Not with a clean-up of spaces before
        punctuation (WordPiece's, or transformers' ``clean_up_tokenization_spaces``), which rewrites
        "the ' brown" to "the'brown" across tokens already shown."""
        if getattr(self.tokenizer, "clean_up_tokenization_spaces", False):
            return False
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:  # a slow (Python) tokenizer: its decoding is not known here
            return False
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
        return bool(parts) and all(part.get("type") in TOKENWISE_DECODERS for part in parts)

    def same_vocabulary(self, other: TextCodec) -> bool:
        return self is other or self.vocab == other.vocab

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids for ``prompt``; with ``chat`` the chat template wraps it as one user turn."""
        check_prompt(prompt)
        if chat:
            return self.encode_messages([{"role": "user", "content": prompt}])
        return list(self.tokenizer(prompt)["input_ids"])

    def encode_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids for a conversation (``[{"role": ..., "content": ...}, ...]``) ready for the reply,
        with ``tools`` (OpenAI's function definitions) as the template shows them."""
        if not self.has_chat_template:
            raise SpecdecError(f"model {self.name} has no chat template (it is a base model): "
                               "send a plain prompt instead")
        try:
            ids = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # jinja errors: roles the template refuses, missing fields
            raise SpecdecError(f"the chat template of {self.name} refused these messages: {exc}") from exc
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def final_text(self, ids: Sequence[int]) -> str:
        """The text of a finished generation: a character cut in two by the token limit is dropped."""
        return self.decode(ids).rstrip(REPLACEMENT)


def different_vocabularies(draft: str, target: str) -> str:
    """The message for a draft model whose tokens mean something else to the target."""
    return (f"draft model {draft} and target {target} have different vocabularies; "
            "token-level drafting needs the same tokenizer")


def vocabularies_differ(a: Path, b: Path) -> bool:
    """Whether two tokenizer folders (transformers folders, or ``ResolvedModel.tokenizer_dir``s read
    from GGUFs) are known to have different vocabularies.

    Read from the tokenizer files alone, so a mismatch is refused before any weights load: identical
    ``tokenizer.json`` files agree; otherwise both tokenizers are loaded (well under a second) and
    compared as :meth:`TextCodec.same_vocabulary` will compare them. A tokenizer that cannot be
    loaded counts as "not known": loading the model reports it properly.
    """
    files = [folder / "tokenizer.json" for folder in (a, b)]
    try:
        if files[0].read_bytes() == files[1].read_bytes():
            return False
    except OSError:
        pass  # e.g. a SentencePiece-only folder: compare the loaded tokenizers
    from transformers import AutoTokenizer

    try:
        vocabs = [AutoTokenizer.from_pretrained(folder).get_vocab() for folder in (a, b)]
    except (OSError, ValueError):
        return False
    return vocabs[0] != vocabs[1]


def check_prompt(prompt: object) -> None:
    """A prompt must be non-blank text that can be encoded as UTF-8."""
    if not isinstance(prompt, str):
        raise SpecdecError(f"the prompt must be text or a list of token ids, got {type(prompt).__name__}")
    if not prompt.strip():
        raise SpecdecError("the prompt is empty")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecdecError("the prompt is not valid UTF-8 text") from None


class StopStrings:
    """Strings that end generation once they appear in the output; they are not part of the text.

    Empty strings are ignored (they would match everywhere). A single string may be given as is.
    """

    def __init__(self, stops: str | Sequence[str] | None, codec: TextCodec) -> None:
        if stops is None:
            stops = ()
        elif isinstance(stops, str):
            stops = (stops,)
        if any(not isinstance(s, str) for s in stops):
            raise SpecdecError("stop strings must be text")
        self.strings = tuple(s for s in stops if s)
        self.codec = codec
        # Decoding only a tail keeps the check O(1) per token; 4 tokens per character covers
        # byte-level pieces of multi-byte characters.
        self._window = 4 * max((len(s) for s in self.strings), default=0) + 8

    def __bool__(self) -> bool:
        return bool(self.strings)

    def hit(self, ids: list[int]) -> bool:
        """Whether the output ``ids`` now contain a stop string (the engine's stop callback)."""
        tail = self.codec.decode(ids[-self._window:])
        return any(s in tail for s in self.strings)

    def visible(self, text: str) -> str:
        """``text`` up to the first stop string."""
        cut = min((i for i in (text.find(s) for s in self.strings) if i >= 0), default=-1)
        return text if cut < 0 else text[:cut]

    def safe_length(self, text: str) -> int:
        """How much of unfinished ``text`` can be shown: not a partial character, not a possible stop."""
        end = len(text)
        while end and text[end - 1] == REPLACEMENT:
            end -= 1
        for s in self.strings:
            for n in range(min(len(s) - 1, end), 0, -1):
                if text[end - n:end] == s[:n]:
                    end -= n
                    break
        return end


class TextDeltas:
    """The text a growing generation may show, as deltas: held back while it could still turn into
    a stop string or ends inside a character, released once the next step (or the end) decides it.
    Streaming in the API and the server both read the text through this."""

    def __init__(self, codec: TextCodec, stops: StopStrings) -> None:
        self.codec = codec
        self.stops = stops
        self.shown = 0
        # The text of ids[:_read], which ends on a whole character, and where the window decoded
        # again for context starts (see _text_of).
        self._text = ""
        self._context = 0
        self._read = 0

    def update(self, ids: Sequence[int], done: bool) -> str:
        """The new text to show, given all new token ids so far and whether generation ended."""
        if done:
            text = self.stops.visible(self.codec.final_text(ids))
            ready = len(text)
        else:
            tokenwise = self.codec.decodes_by_token
            text = self.stops.visible(self._text_of(ids) if tokenwise else self.codec.decode(ids))
            ready = self.stops.safe_length(text)
            if not tokenwise:  # a clean-up may still drop a space this close to the end
                ready = max(0, min(ready, len(text) - CLEAN_UP_REACH))
        delta = text[self.shown:ready]
        self.shown = max(self.shown, ready)
        return delta

    def _text_of(self, ids: Sequence[int]) -> str:
        """``codec.decode(ids)``, decoding only the tokens since the last whole character and the
        few before them (decoding every step's whole output made a stream's steps cost O(n) each:
        0.8 s of the event loop's thread over a 2,048-token answer, beside the forwards).

        The new tokens are decoded after a window of tokens already shown, and their text is what
        the window's decoding adds to the window's own: a tokenizer that strips a sequence's first
        space or joins bytes across tokens does so inside the window, as in the whole decoding.
        Only for a codec that :attr:`~TextCodec.decodes_by_token`; where the window's text still
        does not begin with its known part, the whole output is decoded instead."""
        ids = list(ids)
        if len(ids) < self._read:  # not the output this followed: start over
            self._text, self._context, self._read = "", 0, 0
        window = self.codec.decode(ids[self._context:])
        known = self.codec.decode(ids[self._context:self._read])
        if not window.startswith(known):
            return self.codec.decode(ids)
        added = window[len(known):]
        text = self._text + added
        if added and not added.endswith(REPLACEMENT):  # a whole character: later windows start here
            self._text, self._context, self._read = text, self._read, len(ids)
        return text
