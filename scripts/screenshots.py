"""Regenerate the README's screenshots (docs/*.png) from a real model: the HTML trace, the live
terminal view and ``specdec replay``. Needs the system Chromium (``make browser``).

    .venv/bin/python scripts/screenshots.py [--model smollm2-135m] [--backend llamacpp]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

import specdec
from specdec.commands.generate import plain_step_s
from specdec.bench.questions import load_questions
from specdec.trace import Detokenizer, document, step_record
from specdec.views.files import save
from specdec.views.terminal import LiveView, describe, replay

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tests"))  # the headless Chromium the page tests drive too
from browser import chromium  # noqa: E402


def question(category: str) -> str:
    """The first shipped Spec-Bench question of ``category``."""
    found = load_questions("spec-bench", [category], 1)
    if not found:
        raise SystemExit(f"no Spec-Bench question of category {category!r}")
    return found[0].prompt


def terminal_png(console: Console, name: str, browser, folder: Path) -> None:
    svg = folder / f"{name}.svg"
    svg.write_text(console.export_svg(title=f"specdec {name}"), encoding="utf-8")
    browser.get(svg.as_uri())
    browser.find_element("tag name", "svg").screenshot(str(DOCS / f"{name}.png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--category", default="extraction",
                        help="the first Spec-Bench question of this category is the prompt")
    args = parser.parse_args()
    model = specdec.load(args.model, backend=args.backend)
    prompt = question(args.category)
    settings = dict(drafter="ngram", max_new_tokens=160, temperature=0.0)
    out = model.generate(prompt, chat=model.has_chat_template, trace=True, **settings)
    doc = document(out, model, settings=settings, plain_step_s=plain_step_s(model))
    folder = Path(tempfile.mkdtemp(prefix="specdec-shots-"))
    page = save(doc, folder / "trace.html")
    save(doc, folder / "trace.json")
    DOCS.mkdir(exist_ok=True)
    browser = chromium(1400, 1000)
    try:
        browser.get(page.as_uri())
        # Show a step in the middle that rejected something, with a token's tooltip open.
        middle = next((i for i, s in enumerate(doc["steps"]) if s["kind"] == "correction" and i > len(doc["steps"]) // 2),
                      len(doc["steps"]) - 1)
        browser.execute_script(f"go({middle + 1})")
        from selenium.webdriver.common.action_chains import ActionChains

        token = browser.find_elements("css selector", "#text .tok.current")[0]
        ActionChains(browser).move_to_element(token).perform()
        browser.save_screenshot(str(DOCS / "trace-html.png"))

        # The live view as it looks mid-generation.
        live = Console(record=True, width=110, height=30, file=io.StringIO(), force_terminal=True,
                       color_system="truecolor")
        view = LiveView(live, doc["plain_step_s"], describe(doc))
        detok = Detokenizer(model.loaded.codec)
        for step in out.trace[: 2 * len(out.trace) // 3]:
            view.add(step_record(step, model.loaded.codec, detok.add(step.emitted)))
        live.print(view.frame(whole=True))
        terminal_png(live, "live-terminal", browser, folder)

        replayed = Console(record=True, width=110, file=io.StringIO(), force_terminal=True, color_system="truecolor")
        replay(json.loads((folder / "trace.json").read_text(encoding="utf-8")), console=replayed)
        terminal_png(replayed, "replay-terminal", browser, folder)
    finally:
        browser.quit()
    print(f"wrote {DOCS}/trace-html.png, live-terminal.png, replay-terminal.png (trace files in {folder})")


if __name__ == "__main__":
    main()
