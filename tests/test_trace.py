"""The step trace: every generated token accounted for exactly once, stats recomputed from the
records, trace files that load back, and the CLI's --trace / --live / replay."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ScriptDrafter
from specdec.backends.toy import ToyLM
from specdec.cli import main
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine import DecodeConfig, decode
from specdec.errors import SpecdecError
from specdec.policies.fixed import FixedK
from specdec.sampling import SamplingParams
from specdec.trace import Detokenizer, document, load, segments, stats_of
from specdec.views.files import save

TARGET_FATES = {"correction", "bonus", "plain"}


def make_drafter(kind: str, lm: ToyLM, seed: int, tree: bool, reference: list[int]):
    if kind == "ngram":
        return NgramDrafter(tree=tree)
    if kind == "model":
        return ModelDrafter(lm.perturbed(1.0, seed).backend(), tree=tree)
    return ScriptDrafter(reference, lm.vocab_size, right=False)  # every draft wrong: corrections only


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["ngram", "model", "wrong"]), tree=st.booleans(),
       temperature=st.sampled_from([0.0, 0.8]), verify=st.sampled_from(["coupled", "rejection"]),
       k=st.integers(1, 6), max_new=st.integers(1, 30))
def test_every_token_is_accounted_for_once(seed, kind, tree, temperature, verify, k, max_new):
    lm = ToyLM(8, 2, seed=seed, scale=3.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    cfg = DecodeConfig(max_new_tokens=max_new, sampling=SamplingParams(temperature, seed=seed), verify=verify,
                       record=True)
    plain = decode(lm.backend(), prompt, cfg)
    out = decode(lm.backend(), prompt, cfg, make_drafter(kind, lm, seed, tree, prompt + plain.token_ids), FixedK(k))
    emitted: list[int] = []
    for step in out.trace:
        record = {**step.to_dict(), "kind": step.kind}
        segs = segments(record)
        kept = [s for s in segs if s.fate == "accepted" or s.fate in TARGET_FATES]
        # Accepted drafts, then at most one target token, and nothing else reaches the text.
        assert [s.token for s in kept] == step.emitted
        assert [s.fate for s in kept].count("accepted") == step.accepted
        assert sum(s.fate in TARGET_FATES for s in kept) == len(step.emitted) - step.accepted <= 1
        # Every drafted node appears once: accepted, rejected or never judged.
        assert sorted(s.node for s in segs if s.node is not None) == list(range(len(step.drafted)))
        rejected = [s for s in segs if s.fate == "rejected"]
        if step.kind == "correction" and step.target_token is not None and not step.parents:
            # The judged rejected token sits where the correction went, and is not what was written.
            assert len(rejected) == 1 and rejected[0].node == step.accepted
            assert rejected[0].token != step.target_token or cfg.verify == "rejection"
        if step.kind == "bonus" and not step.parents:  # (a tree's bonus path can pass rejected siblings)
            assert not rejected
        if step.drafted:
            assert len(step.target_probs) == len(step.accept_probs) == len(step.drafted)
            assert all(0.0 <= a <= 1.0 for a in step.accept_probs)
        emitted += step.emitted
    assert emitted == out.token_ids


def test_greedy_rejections_never_equal_the_correction():
    lm = ToyLM(10, 2, seed=3, scale=2.0)
    cfg = DecodeConfig(max_new_tokens=40, record=True)
    out = decode(lm.backend(), [1, 2, 3], cfg, ModelDrafter(lm.perturbed(2.0, 1).backend()), FixedK(4))
    corrections = [s for s in out.trace if s.kind == "correction" and s.target_token is not None]
    assert corrections, "the noisy drafter should be rejected somewhere"
    for step in corrections:
        assert step.drafted[step.accepted] != step.target_token
        # Greedy: the target's own token is its argmax, so the rejected token's p is below it.
        assert step.accept_probs[step.accepted] < 1.0


@pytest.mark.parametrize("kwargs", [dict(drafter="ngram"), dict(drafter="ngram", tree=True),
                                    dict(drafter="none"), dict(drafter="ngram", temperature=0.9, seed=4)])
def test_stats_recomputed_from_the_saved_trace_equal_the_generation_s(tiny, tmp_path, kwargs):
    prompt = "the quick brown fox the quick brown dog the quick brown"
    out = tiny.generate(prompt, max_new_tokens=24, num_draft=5, policy="fixed", trace=True, **kwargs)
    doc = document(out, tiny, settings=kwargs, plain_step_s=0.01)
    path = save(doc, tmp_path / "t.json")
    again = load(path)
    assert stats_of(again).to_dict() == out.stats.to_dict()
    assert again["token_ids"] == out.token_ids and again["text"] == out.text
    # The emitted pieces spell the text (up to a character the token limit cut in two).
    pieces = "".join(p for step in again["steps"] for p in step["emitted_text"])
    assert pieces == tiny.decode(out.token_ids).rstrip("\ufffd")


def test_detokenizer_pieces_spell_the_decoded_text(tiny):
    ids = tiny.encode("naïve café — 東京 🙂 the end") * 3
    detok = Detokenizer(tiny.loaded.codec)
    pieces = detok.add(ids[:5]) + detok.add(ids[5:])
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tiny.decode(ids)


def test_html_trace_is_one_self_contained_page(tiny, tmp_path):
    out = tiny.generate("the quick brown fox </script> the quick brown", max_new_tokens=16, trace=True)
    page = save(document(out, tiny), tmp_path / "t.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "/*TRACE*/" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert page.count("</script>") == 1  # the prompt's "</script>" was escaped inside the data


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_trace_json_then_replay(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "out.json"
    code, out, err = run_cli(capsys, "generate", "the quick brown fox the quick brown", "--model",
                             str(tiny_model_dir), "--max-new-tokens", "20", "--trace", str(path), "--json")
    assert code == 0, err
    result = json.loads(out)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["token_ids"] == result["token_ids"] and doc["stats"] == result["stats"]
    assert sum(len(s["emitted"]) for s in doc["steps"]) == len(result["token_ids"])
    code, out, err = run_cli(capsys, "replay", str(path), "--steps")
    assert code == 0, err
    assert out == ""  # the rendering is on stderr
    assert "acceptance" in err and "mean accepted length" in err and "verify ms" in err


def test_generate_trace_html(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "out.html"
    code, out, err = run_cli(capsys, "generate", "the quick brown fox", "--model", str(tiny_model_dir),
                             "--max-new-tokens", "12", "--tree", "--trace", str(path))
    assert code == 0, err
    assert f"trace written to {path}" in err
    assert '"format": "specdec-trace"' in path.read_text(encoding="utf-8")


def test_live_view_keeps_stdout_exactly_the_text(capsys, tiny_model_dir):
    args = ["generate", "the quick brown fox the quick", "--model", str(tiny_model_dir), "--max-new-tokens", "16"]
    code, plain, _ = run_cli(capsys, *args)
    code, live, err = run_cli(capsys, *args, "--live")
    assert code == 0, err
    assert live == plain  # stdout is not a terminal here: exactly the text
    assert "accepted draft" in err and "mean accepted length" in err  # legend and counters on stderr


@pytest.mark.parametrize("content, message", [
    (None, "no trace file"),
    (b"\xff\xfe", "not a JSON trace"),
    (b"<!DOCTYPE html><html></html>", "an HTML trace is for the browser"),
    (b'{"a": 1}', "not a specdec trace"),
    (b'{"format": "specdec-trace", "version": 99, "steps": []}', "version 99"),
    (b'{"format": "specdec-trace", "version": 1, "steps": [{"drafted": [1]}]}', "damaged trace"),
    (b'{"format": "specdec-trace", "version": 1, "steps": [{"position": 0, "drafted": [1], "accepted": 3, '
     b'"emitted": [2], "kind": "bonus", "draft_s": 0, "verify_s": 0}]}', "damaged trace"),
])
def test_replay_refuses_what_is_not_a_trace(capsys, tmp_path, content, message):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run_cli(capsys, "replay", str(path))
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("target, message", [("out.txt", "ending in .json or .html"),
                                             ("missing/out.json", "does not exist"), (".", "ending in .json")])
def test_bad_trace_paths_are_refused_before_loading(capsys, tmp_path, no_loading, tiny_model_dir, target, message):
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(tiny_model_dir),
                             "--trace", str(tmp_path / target))
    assert code == 2 and message in err
    assert not no_loading


def test_trace_path_check_is_usable_from_python(tmp_path):
    with pytest.raises(SpecdecError, match="folder"):
        save({"steps": []}, tmp_path / "sub" / "x.json")


def test_the_trace_document_does_not_import_its_views():
    """No import cycle: views read trace documents; a document knows nothing of its views."""
    import subprocess
    import sys

    code = ("import sys, specdec.trace; "
            "print(sorted(m for m in sys.modules if m.startswith('specdec.views')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
