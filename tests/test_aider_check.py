"""scripts/aider_check.py: the edit it asks for, and where it says each server's time went."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "aider_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("aider_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_expected_file_renames_the_parameter_everywhere_and_changes_nothing_else():
    check = _script()
    assert check.MODULE.count("\n") == 48
    ast.parse(check.MODULE)
    tree = ast.parse(check.EXPECTED)
    wrap = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "wrap")
    assert [a.arg for a in wrap.args.args] == ["s", "width", "indent", "keep_blank"]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "w" not in names and "width" in names
    before, after = check.MODULE.splitlines(), check.EXPECTED.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == 5  # signature, docstring, check, message, loop
    assert all("w" in before[i] and "width" in after[i] for i in changed)


def test_llama_server_phases_come_from_its_own_timings_less_the_readiness_probe(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "I slot print_timing: id  3 | task 0 | prompt eval time =    1025.36 ms /    33 tokens (31.07 ms per token)\n"
        "I slot print_timing: id  3 | task 0 |        eval time =       0.00 ms /     1 tokens (0.00 ms per token)\n"
        "I slot launch_slot_: id  2 | task 2 | processing task\n"
        "I slot print_timing: id  2 | task 2 | prompt eval time =   19318.32 ms /  1047 tokens (18.45 ms per token)\n"
        "I slot print_timing: id  2 | task 2 |        eval time =   27267.99 ms /   483 tokens (56.57 ms per token)\n",
        encoding="utf-8")
    assert _script()._phases("llama-server-plain", log, tmp_path / "none", 0.0) == {
        "prompt_s": 19.32, "decode_s": 27.27, "tokens": 483}


def test_specdec_phases_come_from_the_ticks_of_the_call(tmp_path):
    ticks = tmp_path / "ticks.jsonl"
    lines = [
        {"t": 5.0, "seconds": 0.5, "rows": [8], "offered": [None]},  # the readiness probe's prompt: before the call
        {"t": 10.0, "seconds": 10.4, "rows": [512], "offered": [None]},
        {"t": 20.4, "seconds": 0.8, "rows": [22], "offered": [None]},
        {"t": 21.2, "seconds": 0.09, "rows": [3], "offered": [3]},  # a step with its draft
        {"t": 21.3, "seconds": 0.05, "rows": [1], "offered": [None]},  # a plain step
        {"t": 21.4, "seconds": 0.06, "rows": [1], "offered": [1]},
    ]
    ticks.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert _script()._phases("specdec", tmp_path / "none.log", ticks, 9.0) == {"prompt_s": 11.2, "decode_s": 0.2}
