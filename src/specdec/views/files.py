"""A trace document written to a file, in the form the file's name asks for: ``.json`` (the
document itself, which ``specdec replay`` reads back with :func:`specdec.trace.load`) or
``.html`` (the self-contained page of :mod:`specdec.views.html`).

It lives with the views, not in :mod:`specdec.trace`, so that the document does not know its views.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.files import write_atomic
from specdec.trace import check_path


def save(doc: dict, path: str | Path) -> Path:
    """Write ``doc`` as JSON or as a self-contained HTML page, by the file's suffix."""
    path = Path(path)
    check_path(path)
    if path.suffix.lower() == ".html":
        from specdec.views.html import render

        content = render(doc)
    else:
        content = json.dumps(doc, ensure_ascii=False, allow_nan=False)
    try:
        write_atomic(path, content)
    except OSError as exc:
        raise SpecdecError(f"cannot write the trace to {path}: {exc.strerror or exc}") from None
    return path
