"""Constrained decoding: a JSON Schema, a regular expression or a grammar as a mask on the target's
logits, computed by llguidance (the grammar engine llama.cpp, vLLM and TensorRT-LLM use).

The target's distribution at every position is masked to the tokens the grammar allows after the
tokens before it, and the masked distribution is what plain decoding and verification both choose
from: greedy constrained output with speculation is token for token plain constrained decoding's,
and sampled output follows the masked target distribution (the same seed gives the same text).

Speculation gains from the grammar in two ways. A draft token the grammar forbids can never be the
target's choice, so the draft is cut there before the target pays for it. And where the grammar
allows a single continuation (a JSON object's keys and punctuation), its tokens are known without
any model: llguidance's fast-forward tokens join the draft with confidence 1, so a run of N forced
tokens costs one verifying forward, not N.

:class:`Grammar` is a compiled constraint for one model's tokenizer
(:meth:`specdec.loaded.LoadedModel.grammar`); :meth:`Grammar.start` gives a :class:`Constraint`,
the state of one generation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.errors import SpecdecError


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as exc:  # a declared dependency; a broken install should still say what is missing
        raise SpecdecError("constrained decoding needs llguidance: pip install llguidance") from exc
    return llguidance


def json_schema_of(schema: Any) -> dict:
    """A JSON Schema from a dict, a JSON string, or a pydantic model class (``model_json_schema``)."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SpecdecError(f"the JSON Schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise SpecdecError(f"a JSON Schema must be an object (a dict or a pydantic model), got {type(schema).__name__}")
    return schema


# The JSON layout answers are held to, unless a schema sets its own (llguidance's top-level
# "x-guidance" key): one line, with Python's json.dumps separators. Free whitespace leaves every
# newline and indent to the model, so nothing between a value and the next key is forced; in
# this layout `", "key": "` is, and the grammar drafts it (see the module). Measured on
# Qwen2.5-Coder-1.5B's answers to the structured workload: as many answers complete, in fewer
# tokens (CHANGELOG).
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def with_layout(schema: dict) -> dict:
    """``schema`` held to :data:`COMPACT` where it does not choose its own layout."""
    return schema if "x-guidance" in schema else {**schema, "x-guidance": COMPACT}


@dataclass(frozen=True)
class Spec:
    """What a generation is constrained to, as the user gave it: one of ``json_schema`` (a dict),
    ``json_object`` (any JSON object), ``regex``, ``lark`` (a Lark grammar, llguidance's dialect)
    or ``gbnf`` (llama.cpp's grammar format)."""

    kind: str
    source: str = ""

    KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")

    def grammar_text(self) -> str:
        """The grammar llguidance compiles."""
        llg = _llguidance()
        matcher = llg.LLMatcher
        if self.kind == "json_schema":
            return matcher.grammar_from_json_schema(with_layout(json.loads(self.source)))
        if self.kind == "json_object":
            return matcher.grammar_from_json_schema(with_layout({"type": "object"}))
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return matcher.grammar_from_lark(self.source)
        if self.kind == "gbnf":
            try:
                return matcher.grammar_from_lark(llg.gbnf_to_lark(self.source))
            except Exception as exc:  # the converter raises its parser's own errors
                raise SpecdecError(f"the GBNF grammar could not be read: {exc}") from None
        raise SpecdecError(f"unknown constraint {self.kind!r}: use one of {', '.join(self.KINDS)}")


def spec_of(response_format: Any = None, regex: str | None = None, grammar: str | None = None) -> Spec | None:
    """The one constraint the arguments ask for (None: none). ``response_format`` is a JSON Schema
    (dict, JSON text or pydantic model) or OpenAI's form (``{"type": "json_schema", "json_schema":
    {"schema": ...}}``, ``{"type": "json_object"}``, ``{"type": "text"}``); ``grammar`` a Lark
    grammar, or GBNF where its rules are written ``name ::= ...``."""
    given = [name for name, value in (("response_format", response_format), ("regex", regex),
                                      ("grammar", grammar)) if value is not None]
    if len(given) > 1:
        raise SpecdecError(f"give one constraint, not {' and '.join(given)}")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise SpecdecError("regex must be a non-empty string")
        return Spec("regex", regex)
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise SpecdecError("grammar must be a non-empty string")
        return Spec("gbnf" if "::=" in grammar else "lark", grammar)
    if response_format is None:
        return None
    # OpenAI's form: none of its types is a JSON Schema type, so it cannot be taken for a schema
    if isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object", "text"):
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return Spec("json_object")
        inner = response_format.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise SpecdecError("response_format.json_schema must carry a schema")
        return Spec("json_schema", json.dumps(json_schema_of(inner["schema"])))
    return Spec("json_schema", json.dumps(json_schema_of(response_format)))


def one_line(message: str) -> str:
    """The grammar engine's message on one line: its sentences, without the source excerpt and
    caret it draws under them."""
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not re.match(r"\s*(\d+\s*\||\^)", line)]
    return "; ".join(dict.fromkeys(lines))


class Grammar:
    """A constraint compiled for one model's tokenizer (checked when made: a schema, expression or
    grammar llguidance cannot compile is a :class:`SpecdecError` with its message)."""

    def __init__(self, spec: Spec, tokenizer) -> None:
        llg = _llguidance()
        self.spec = spec
        self.tokenizer = tokenizer
        try:
            self.text = spec.grammar_text()
        except ValueError as exc:
            raise SpecdecError(f"the {spec.kind.replace('_', ' ')} could not be compiled: {one_line(str(exc))}") \
                from None
        error = llg.LLMatcher.validate_grammar(self.text, tokenizer)
        if error:
            raise SpecdecError(f"the {spec.kind.replace('_', ' ')} could not be compiled: {one_line(error)}")

    def start(self) -> Constraint:
        """The state of a new generation under this constraint."""
        return Constraint(_llguidance().LLMatcher(self.tokenizer, self.text, log_level=0), self.tokenizer.vocab_size,
                          self.tokenizer)


def grammar_tokenizer(hf_tokenizer, vocab_size: int, eos_ids: Sequence[int]):
    """llguidance's view of a model's tokenizer (about a second to build: keep it per model), over
    the model's ``vocab_size`` logits (ids past the tokenizer's are never allowed)."""
    llg = _llguidance()
    try:
        return llg.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids) or None)
    except Exception as exc:  # a slow (Python) tokenizer, or one the Rust side cannot read
        raise SpecdecError(f"constrained decoding cannot use this model's tokenizer: {exc}") from None


@dataclass(frozen=True)
class ForcedRun:
    """The continuation a grammar forces: tokens certain whatever comes next, then tokens that
    are the forced text's canonical tokenization but may not be the model's."""

    certain: list[int]
    likely: list[int]


class Constraint:
    """One generation's place in its grammar: which tokens may come next, rolled back and forth
    as drafts are checked."""

    def __init__(self, matcher, vocab_size: int, tokenizer=None) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer  # llguidance's, for the forced text's tokenization (None: no likely tokens)
        self._words = (vocab_size + 31) // 32
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise SpecdecError(f"the grammar failed: {self.matcher.get_error()}")

    def forced(self, after: Sequence[int] = ()) -> ForcedRun:
        """What the grammar makes the continuation here, or after ``after`` (tokens it allows from
        here, as a draft holds them): llguidance's fast-forward tokens (``certain``: the canonical
        tokenization of the forced text, whatever follows it), then the rest of that text's
        canonical tokenization (``likely``: its last token may merge with what the model writes
        next, as ` [` becomes ` [{"`). The state is left where it was."""
        if after and self.allowed_prefix(after) < len(after):
            return ForcedRun([], [])
        consumed = 0
        try:
            for token in after:
                if self.matcher.is_stopped():  # the end of sequence after the grammar's end
                    return ForcedRun([], [])
                if not self.matcher.consume_token(token):
                    self._check()
                consumed += 1
            if self.matcher.is_stopped():
                return ForcedRun([], [])
            certain = list(self.matcher.compute_ff_tokens())
            text = self.matcher.compute_ff_bytes()
            whole = list(self.tokenizer.tokenize_bytes(text)) if text and self.tokenizer is not None else []
            likely = whole[len(certain):] if whole[:len(certain)] == certain else []
            return ForcedRun(certain, likely)
        finally:
            if consumed:
                self.matcher.rollback(consumed)

    def only_token(self) -> int | None:
        """The one token the grammar allows here once it has ended (the end of sequence), or None
        where it has not ended."""
        if not self.matcher.is_stopped():
            return None
        allowed = np.flatnonzero(self.masks([])[0])
        return int(allowed[0]) if len(allowed) == 1 else None

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here."""
        return self.matcher.validate_tokens(list(tokens)) if tokens else 0

    def masks(self, tokens: Sequence[int]) -> np.ndarray:
        """``[len(tokens) + 1, vocab]`` booleans: the tokens allowed here and after each prefix of
        ``tokens`` up to its first forbidden token (the state is left where it was)."""
        bits = np.empty((len(tokens) + 1, self._words), dtype=np.int32)
        consumed = 0
        try:
            for i in range(len(tokens) + 1):
                row = bits[i]
                self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
                if not row.any():
                    self._check()
                    raise SpecdecError("the grammar allows no token here")
                if i < len(tokens):
                    token = tokens[i]
                    allowed = (int(row.view(np.uint32)[token >> 5]) >> (token & 31)) & 1
                    # After the grammar's end only an end of sequence may follow, which ends the
                    # generation; a forbidden draft token is rejected where it stands: the rows
                    # after either are never read.
                    if self.matcher.is_stopped() or not allowed:
                        bits[i + 1:] = row
                        break
                    if not self.matcher.consume_token(token):
                        self._check()
                    consumed += 1
        finally:
            if consumed:
                self.matcher.rollback(consumed)
        return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size].astype(bool)

    def consume(self, tokens: Sequence[int]) -> None:
        """The generation went on with ``tokens`` (every one allowed: they were chosen under the mask)."""
        for token in tokens:
            if self.matcher.is_stopped():  # the end of sequence that follows the grammar's end
                return
            if not self.matcher.consume_token(token):
                self._check()


def apply(logits: torch.Tensor, masks: np.ndarray) -> torch.Tensor:
    """``logits`` ``[n, V]`` with every token the mask of its row forbids at -inf (a new tensor:
    a backend's logits may be its own buffer). Rows past the masks' are left out."""
    n = logits.shape[0]
    allowed = torch.from_numpy(masks[:n])
    width = logits.shape[-1]
    if allowed.shape[-1] < width:  # logits past the constraint's vocabulary: never allowed
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]), value=False)
    return logits.masked_fill(~allowed[:, :width].to(logits.device), float("-inf"))
