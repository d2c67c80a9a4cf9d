"""The trace as one self-contained HTML page (no network at view time): the template
``trace.html`` with the trace document embedded as JSON.

Each step's tokens are laid out by :func:`specdec.trace.segments` here, in Python, so the page and
the terminal views cannot disagree about a token's fate; the page's script only draws.
"""

from __future__ import annotations

import json
from importlib import resources

from specdec.trace import estimated_speedup, segments, stats_of
from specdec.views.terminal import describe

PLACEHOLDER = "/*TRACE*/null"


def page_data(doc: dict) -> dict:
    """What the page's script reads: the document, each step's segments and the summary."""
    stats = stats_of(doc)
    speedup = estimated_speedup(stats, doc.get("plain_step_s"))
    steps = []
    for record in doc["steps"]:
        segs = [{"t": s.text, "f": s.fate, "n": s.node} for s in segments(record)]
        steps.append({**record, "segments": segs})
    return {**doc, "steps": steps, "title": describe(doc),
            "summary": {**stats.to_dict(), "estimated_speedup": None if speedup is None else round(speedup, 3)}}


def render(doc: dict) -> str:
    """The HTML page of a trace document."""
    template = resources.files("specdec.views").joinpath("trace.html").read_text(encoding="utf-8")
    # "</" inside a <script> would end it early; "<\/" is the same string to JavaScript.
    data = json.dumps(page_data(doc), ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
    return template.replace(PLACEHOLDER, data, 1)
