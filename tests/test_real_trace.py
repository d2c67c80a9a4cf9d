"""The trace views end to end on a real model (SmolLM2-135M-Instruct on llama.cpp): --live,
--trace out.html, --trace out.json and replay, as a user runs them, and the page in Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from browser import BROWSERS, DRIVERS, chromium, find

pytestmark = pytest.mark.real

pytest.importorskip("llama_cpp", reason="the llama.cpp backend is an optional extra (make setup installs it)")
PROMPT = "List the first five prime numbers, then list them again in reverse order."


def specdec(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "specdec.cli", *argv], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A --live run saving its trace as JSON, and a plain run saving its page, as a user runs them."""
    folder = tmp_path_factory.mktemp("trace")
    common = ["--model", "smollm2-135m", "--chat", "--backend", "llamacpp", "--max-new-tokens", "48"]
    html, data = folder / "out.html", folder / "out.json"
    live = specdec("generate", PROMPT, *common, "--live", "--trace", str(data))
    plain = specdec("generate", PROMPT, *common, "--drafter", "none", "--trace", str(html))
    return live, plain, html, data


def test_live_trace_and_replay_on_a_real_model(traced):
    live, plain, html, data = traced
    assert live.returncode == 0, live.stderr
    assert plain.returncode == 0, plain.stderr
    assert live.stdout == plain.stdout  # greedy: the same text, and stdout carries only the text
    assert "accepted draft" in live.stderr and "mean accepted length" in live.stderr

    doc = json.loads(data.read_text(encoding="utf-8"))
    assert doc["text"] == live.stdout and doc["model"] == "smollm2-135m"
    assert sum(len(s["emitted"]) for s in doc["steps"]) == len(doc["token_ids"])
    replay = specdec("replay", str(data), "--steps")
    assert replay.returncode == 0, replay.stderr
    assert doc["text"].split()[0] in replay.stderr and "verify ms" in replay.stderr


def test_the_real_models_page_in_chromium(traced):
    _, plain, html, _ = traced
    assert plain.returncode == 0, plain.stderr
    if find(BROWSERS) is None or find(DRIVERS) is None:
        pytest.skip("no system Chromium: install Debian's chromium and chromium-driver (make test does)")
    pytest.importorskip("selenium", reason="the page tests drive Chromium with selenium (the dev extra)")
    browser = chromium()
    try:
        browser.get(html.as_uri())
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
        label = browser.find_element("id", "steplabel").text
        browser.find_element("id", "prev").click()
        assert browser.find_element("id", "steplabel").text != label
    finally:
        browser.quit()
