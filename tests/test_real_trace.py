"""The trace views end to end on a real model (SmolLM2-135M-Instruct on llama.cpp): --live,
--trace out.html, --trace out.json and replay, as a user runs them, and the page in Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.views.browser import chromium

pytestmark = pytest.mark.real

pytest.importorskip("llama_cpp", reason="the llama.cpp backend is an optional extra (make setup installs it)")
PROMPT = "List the first five prime numbers, then list them again in reverse order."


def specdec(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "specdec.cli", *argv], capture_output=True, text=True,
                          timeout=600, env=env)


def test_live_trace_and_replay_on_a_real_model(tmp_path):
    common = ["--chat", "--backend", "llamacpp", "--max-new-tokens", "48"]
    html, data = tmp_path / "out.html", tmp_path / "out.json"
    live = specdec("generate", PROMPT, *common, "--live", "--trace", str(data))
    assert live.returncode == 0, live.stderr
    plain = specdec("generate", PROMPT, *common, "--drafter", "none", "--trace", str(html))
    assert plain.returncode == 0, plain.stderr
    assert live.stdout == plain.stdout  # greedy: the same text, and stdout carries only the text
    assert "accepted draft" in live.stderr and "mean accepted length" in live.stderr

    doc = json.loads(data.read_text(encoding="utf-8"))
    assert doc["text"] == live.stdout and doc["model"] == "smollm2-135m"
    assert sum(len(s["emitted"]) for s in doc["steps"]) == len(doc["token_ids"])
    replay = specdec("replay", str(data), "--steps")
    assert replay.returncode == 0, replay.stderr
    assert doc["text"].split()[0] in replay.stderr and "verify ms" in replay.stderr

    browser = chromium()
    try:
        browser.get(html.as_uri())
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
        label = browser.find_element("id", "steplabel").text
        browser.find_element("id", "prev").click()
        assert browser.find_element("id", "steplabel").text != label
    finally:
        browser.quit()
