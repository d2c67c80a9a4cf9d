"""Trace files: every step of one generation (draft, verdict, timings) as a JSON document.

The document is what the views read: ``specdec generate --trace out.html`` renders it as a
self-contained page (:mod:`specdec.views.html`), ``--trace out.json`` saves it (both through
:func:`specdec.views.files.save`), ``specdec replay`` renders a saved one in the terminal
(:mod:`specdec.views.terminal`), and the live view builds the same step records as it goes. A step
record is :meth:`specdec.types.StepTrace.to_dict` plus the text of its tokens; the generation's
stats are recomputed from the step records, so the numbers a view shows and the ones ``--json``
reports come from one source. The views import this module, never the other way round: a document
does not know its views.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from specdec import tree as trees
from specdec.errors import SpecdecError
from specdec.stats import GenerationStats
from specdec.text import REPLACEMENT, TextCodec
from specdec.types import StepTrace

if TYPE_CHECKING:
    from specdec.api import Model, Output

FORMAT = "specdec-trace"
VERSION = 1
SUFFIXES = (".json", ".html")

Fate = Literal["accepted", "rejected", "unjudged", "correction", "bonus", "plain"]


class Detokenizer:
    """The text each new token adds to the output, computed incrementally.

    A token that ends inside a multi-byte character adds nothing; the token completing it carries
    the character. Only a short window is decoded per token, so the cost does not grow with the text.
    """

    WINDOW = 8

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []

    def add(self, new: Iterable[int]) -> list[str]:
        pieces = []
        for tok in new:
            self.ids.append(tok)
            window = self.ids[-self.WINDOW - 1:]
            before = self.codec.decode(window[:-1]).rstrip(REPLACEMENT)
            after = self.codec.decode(window).rstrip(REPLACEMENT)
            # Normally ``after`` extends ``before``; clean-up rules (" ." -> ".") can rewrite its
            # end, and then the new token's text starts where the two part.
            common = len(before) if after.startswith(before) else next(
                (i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            pieces.append(after[common:])
        return pieces


def token_label(codec: TextCodec, token: int) -> str:
    """How a lone token reads (its text, or its name when it decodes to nothing, e.g. ``</s>``)."""
    text = codec.decode([token])
    if text:
        return text
    names = codec.tokenizer.convert_ids_to_tokens([token])
    return str(names[0]) if names and names[0] is not None else f"<{token}>"


def step_record(step: StepTrace, codec: TextCodec, emitted_text: list[str],
                draft_codec: TextCodec | None = None) -> dict:
    """A step's JSON record: :meth:`StepTrace.to_dict` with the text of its tokens."""
    record = step.to_dict()
    record["kind"] = step.kind
    record["emitted_text"] = emitted_text
    record["drafted_text"] = [token_label(codec, t) for t in step.drafted]
    own = step.extra.get("draft_tokens") if step.extra else None
    if own is not None and draft_codec is not None:
        # A drafter with another vocabulary: what it drafted in its own tokens, before re-tokenization.
        record["draft_model_text"] = [token_label(draft_codec, t) for t in own]
    return record


def _loaded(model):
    """The loaded side of a :class:`specdec.api.Model` (or a loaded model itself)."""
    return getattr(model, "loaded", model)


def own_codec(model: Model, draft_model: Model | None) -> TextCodec | None:
    """The draft model's codec when it tokenizes differently (its own tokens are then worth showing)."""
    codec = model.loaded.codec
    draft_codec = _loaded(draft_model).codec if draft_model is not None else None
    return draft_codec if draft_codec is not None and draft_codec is not codec else None


def document(output: Output, model: Model, *, settings: dict | None = None,
             draft_model: Model | None = None, plain_step_s: float | None = None,
             records: list[dict] | None = None) -> dict:
    """The trace document of a finished generation (``output.trace`` holds its steps).

    ``plain_step_s`` (the measured cost of a plain decoding step) lets views estimate the speed-up;
    ``records`` are the step records if a live view already made them.
    """
    if records is None:
        detok = Detokenizer(model.loaded.codec)
        draft_codec = own_codec(model, draft_model)
        records = [step_record(s, model.loaded.codec, detok.add(s.emitted), draft_codec) for s in output.trace]
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.name,
        "backend": model.loaded.backend_name,
        "draft_model": draft_model.name if draft_model is not None else None,
        "settings": settings or {},
        "prompt": model.decode(output.prompt_ids),
        "prompt_token_ids": list(output.prompt_ids),
        "text": output.text,
        "token_ids": list(output.token_ids),
        "finish_reason": output.finish_reason,
        "timing": {"prefill_s": output.stats.prefill_s, "wall_s": output.stats.wall_s},
        "plain_step_s": plain_step_s,
        "stats": output.stats.to_dict(),
        "steps": records,
    }
    if output.seed is not None:
        doc["seed"] = output.seed
    return doc


def stats_of(doc: dict) -> GenerationStats:
    """The generation's stats, recomputed from the document's step records."""
    stats = GenerationStats(prompt_tokens=len(doc.get("prompt_token_ids", ())))
    for record in doc["steps"]:
        stats.add_step(step_from_record(record))
    timing = doc.get("timing") or {}
    stats.prefill_s = float(timing.get("prefill_s", 0.0))
    stats.wall_s = float(timing.get("wall_s", stats.draft_s + stats.verify_s))
    return stats


def estimated_speedup(stats: GenerationStats, plain_step_s: float | None) -> float | None:
    """Tokens per second of decoding (drafting + verifying) over a plain step's rate on this machine."""
    spent = stats.draft_s + stats.verify_s
    if not plain_step_s or spent <= 0:
        return None
    return stats.new_tokens * plain_step_s / spent


def step_from_record(record: dict) -> StepTrace:
    fields = {k: record[k] for k in ("position", "drafted", "accepted", "emitted", "kind", "draft_s", "verify_s")}
    optional = {k: record.get(k) for k in ("proposed", "draft_forwards", "confidence", "draft_probs",
                                           "target_probs", "accept_probs", "parents", "path", "target_forwards")}
    return StepTrace(**fields, **{k: v for k, v in optional.items() if v is not None},
                     extra=record.get("extra") or {})


@dataclass
class Segment:
    """One token as a view shows it: its text, its fate, and where it sits in its step's draft."""

    token: int
    text: str
    fate: Fate
    node: int | None = None  # index in the step's draft (None: the target's own token)


def segments(record: dict) -> list[Segment]:
    """A step's tokens in reading order: accepted drafts, the rest of the draft (rejected when
    verification judged it, ``unjudged`` after a chain's first rejection or off a tree's accepted
    path; views strike these through or leave them out), then the target's own token if the step
    emitted it.
    """
    drafted, accepted, emitted = record["drafted"], record["accepted"], record["emitted"]
    texts = record.get("emitted_text") or [""] * len(emitted)
    labels = record.get("drafted_text") or [str(t) for t in drafted]
    parents = record.get("parents")
    path = record.get("path")
    kept = (path if path is not None else list(range(len(drafted))))[:accepted]
    out = [Segment(emitted[i], texts[i], "accepted", node) for i, node in enumerate(kept)]
    if parents is None:
        judged_rejected = {accepted} if accepted < len(drafted) and len(emitted) > accepted else set()
    else:
        judged_rejected = {n for n, ok in trees.judged(parents, path or []) if not ok}
    rest = [n for n in range(len(drafted)) if n not in set(kept)]
    out += [Segment(drafted[n], labels[n], "rejected" if n in judged_rejected else "unjudged", n) for n in rest]
    if len(emitted) > accepted:
        out.append(Segment(emitted[-1], texts[len(emitted) - 1], record["kind"]))
    return out


def check_path(path: str | Path) -> None:
    """Refuse a trace path that cannot work, before anything runs."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise SpecdecError(f"--trace needs a file ending in .json or .html, got {str(path)!r}")
    if path.is_dir():
        raise SpecdecError(f"--trace {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise SpecdecError(f"cannot write the trace to {path}: folder {path.parent} does not exist")


def load(path: str | Path) -> dict:
    """A trace document read back from JSON, checked enough that the views can trust it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecdecError(f"no trace file at {path}") from None
    except OSError as exc:
        raise SpecdecError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        hint = " (an HTML trace is for the browser; replay reads the .json one)" if raw.lstrip()[:1] == b"<" else ""
        raise SpecdecError(f"{path} is not a JSON trace{hint}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SpecdecError(f"{path} is not a specdec trace (write one with specdec generate --trace FILE.json)")
    if doc.get("version") != VERSION:
        raise SpecdecError(f"{path} is a trace of version {doc.get('version')}; this specdec reads version {VERSION}")
    try:
        _check_steps(doc["steps"])
        stats_of(doc)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SpecdecError(f"{path} is a damaged trace ({type(exc).__name__}: {exc})") from None
    return doc


def _check_steps(steps: Sequence) -> None:
    if not isinstance(steps, list):
        raise TypeError("steps must be a list")
    for record in steps:
        for key in ("drafted", "emitted"):
            if not all(isinstance(t, int) for t in record[key]):
                raise ValueError(f"{key} must hold token ids")
        if not 0 <= record["accepted"] <= len(record["drafted"]):
            raise ValueError("accepted outside the draft")
        if record["kind"] not in ("plain", "correction", "bonus"):
            raise ValueError(f"unknown step kind {record['kind']!r}")
        for key in ("draft_s", "verify_s"):
            if not math.isfinite(float(record[key])):
                raise ValueError(f"{key} is not a number")
