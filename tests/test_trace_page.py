"""The HTML trace in a real headless Chromium (Debian's chromium + chromium-driver, which
``make test`` installs): it loads without console errors, stepping changes what is shown, hovering
a token shows its probabilities, and the legend, metrics and timeline are there. Chains, trees and
a drafter with another vocabulary all render."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import specdec
from specdec.trace import document
from browser import BROWSERS, DRIVERS, chromium, find
from specdec.views.files import save

PROMPT = "the quick brown fox the quick brown dog the quick brown cat the quick brown"


@pytest.fixture(scope="module")
def browser():
    if find(BROWSERS) is None or find(DRIVERS) is None:
        pytest.skip("no system Chromium: install Debian's chromium and chromium-driver (make test does)")
    pytest.importorskip("selenium", reason="the page tests drive Chromium with selenium (the dev extra)")
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def other_vocab(tiny_other_vocab_dir):
    return specdec.load(str(tiny_other_vocab_dir))


def artifacts() -> Path:
    """Screenshots go outside the repository (SPECDEC_ARTIFACTS, or the temp folder)."""
    folder = Path(os.environ.get("SPECDEC_ARTIFACTS") or Path(tempfile.gettempdir()) / "specdec-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shown(browser) -> tuple[str, int, str]:
    label = browser.find_element("id", "steplabel").text
    tokens = len(browser.find_elements("css selector", "#text .tok"))
    detail = browser.find_element("css selector", "#detail h2").text
    return label, tokens, detail


def severe(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.parametrize("case", ["chain", "tree", "other-vocabulary"])
def test_trace_page_in_chromium(browser, tiny, other_vocab, tmp_path, case):
    kwargs = dict(drafter="ngram", tree=case == "tree")
    draft_model = None
    if case == "other-vocabulary":
        draft_model = other_vocab
        kwargs = dict(drafter="model", draft_model=other_vocab)
    out = tiny.generate(PROMPT, max_new_tokens=24, num_draft=5, policy="fixed", trace=True, **kwargs)
    steps = len(out.trace)
    assert steps >= 3
    page = save(document(out, tiny, settings={"drafter": kwargs["drafter"], "tree": case == "tree"},
                         draft_model=draft_model, plain_step_s=0.01), tmp_path / f"{case}.html")
    browser.get(page.as_uri())
    assert severe(browser) == []

    legend = [e.get_attribute("data-fate") for e in browser.find_elements("css selector", "#legend [data-fate]")]
    assert legend == ["accepted", "rejected", "correction", "bonus", "plain"]
    metrics = browser.find_element("id", "metrics").text
    for name in ("acceptance rate", "mean accepted length", "tokens/s", "speed-up"):
        assert name in metrics
    assert f"{out.stats.new_tokens}\nnew tokens" in metrics

    label, tokens, _ = shown(browser)
    assert label == f"step {steps} / {steps}"
    browser.find_element("id", "first").click()
    assert shown(browser)[:2] == (f"step 0 / {steps}", 0)
    browser.find_element("id", "next").click()
    browser.find_element("id", "next").click()
    label, two_steps, detail = shown(browser)
    assert label == f"step 2 / {steps}" and detail.startswith("step 1 ·") and 0 < two_steps < tokens
    browser.find_element("id", "prev").click()
    assert shown(browser)[0] == f"step 1 / {steps}"
    # The slider and the timeline move the view too.
    browser.execute_script("const s = document.getElementById('slider'); s.value = 3;"
                           "s.dispatchEvent(new Event('input'));")
    assert shown(browser)[0] == f"step 3 / {steps}"
    bars = browser.find_elements("css selector", "#tl g.bar")
    assert len(bars) == steps
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", bars[-1])
    assert shown(browser)[0] == f"step {steps} / {steps}"

    # Hovering a token shows its fate and, for a draft token, the target's probability.
    from selenium.webdriver.common.action_chains import ActionChains

    drafts = browser.find_elements("css selector", "#text .tok.accepted, #text .tok.rejected")
    # A token that wraps over two lines has its centre over another token: hover a one-line one.
    lines = "return arguments[0].getClientRects().length"
    token = next(t for t in drafts if t.text.strip() and browser.execute_script(lines, t) == 1)
    ActionChains(browser).move_to_element(token).perform()
    tip = browser.find_element("id", "tip")
    assert tip.is_displayed() and "target p(x)" in tip.text and "min(1, p/q)" in tip.text
    # The detail panel of a step that drafted: one row per node, a tree drawn as one.
    drafted = next(i for i, s in enumerate(out.trace) if s.drafted and (case != "tree" or s.parents is not None))
    browser.execute_script(f"go({drafted + 1})")
    rows = browser.find_elements("css selector", "#detail tr")
    assert len(rows) == 1 + len(out.trace[drafted].drafted)
    assert browser.find_element("css selector", "#detail th:nth-child(2)").text == ("tree" if case == "tree" else "token")
    if case == "other-vocabulary":
        assert "draft model's own tokens" in browser.find_element("id", "detail").text
    assert severe(browser) == []
    browser.save_screenshot(str(artifacts() / f"trace-{case}.png"))
