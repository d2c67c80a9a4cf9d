"""Memory across generations: a bounded table of earlier outputs' continuations that the n-gram
drafters consult where the context has no match; saved and loaded on request."""

from __future__ import annotations

import json

import pytest

import specdec
from specdec.cli import main
from specdec.drafting.suffix_index import NgramMemory
from specdec.drafters.ngram import NgramDrafter
from specdec.errors import SpecdecError


def test_lookup_finds_the_longest_remembered_match():
    memory = NgramMemory(key=2)
    memory.add([1, 2, 3, 4, 1, 2, 5])
    assert memory.lookup([9, 1, 2]) == (2, {3: 1, 5: 1})  # two matches of length 2, both continuations
    assert memory.lookup([4, 1, 2]) == (3, {5: 1})  # the longer match alone
    assert memory.lookup([2, 3]) == (2, {4: 1})
    assert memory.lookup([7, 7]) is None
    assert memory.lookup([3]) is None  # shorter than the key n-gram
    assert memory.lookup([1, 2, 5]) is None  # the output ends there: nothing to copy


def test_matches_follow_the_remembered_output():
    memory = NgramMemory(key=2)
    memory.add([10, 11, 12, 13, 14])
    found, n = memory.matches([7, 11, 12])
    assert n == 2 and [list(tokens[end:]) for tokens, end in found] == [[13, 14]]


def test_capacity_forgets_the_oldest_output_first():
    memory = NgramMemory(capacity=8, key=2)
    memory.add([1, 2, 3, 4, 5])
    memory.add([6, 7, 8])
    assert len(memory) == 8 and memory.outputs == 2
    memory.add([1, 2, 9])  # 11 tokens: the first output goes, with its index entries
    assert len(memory) == 6 and memory.outputs == 2
    assert memory.lookup([1, 2]) == (2, {9: 1}) and memory.lookup([3, 4]) is None
    assert memory.lookup([6, 7]) == (2, {8: 1})
    with pytest.raises(SpecdecError):
        NgramMemory(capacity=0)


def test_save_and_load_round_trip(tmp_path):
    memory = NgramMemory()
    memory.add([5, 6, 7, 8, 9, 5, 6, 7, 10])
    path = tmp_path / "m.json"
    memory.save(path)
    again = NgramMemory.load(path)
    assert again.lookup([5, 6, 7]) == memory.lookup([5, 6, 7]) == (3, {8: 1, 10: 1})
    assert len(again) == len(memory) == 9
    assert len(NgramMemory.load(tmp_path / "missing.json")) == 0
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(SpecdecError, match="not a usable memory file"):
        NgramMemory.load(tmp_path / "bad.json")


def test_the_drafter_prefers_memory_only_where_it_beats_the_context():
    memory = NgramMemory()
    memory.add([40, 41, 42, 43, 44])
    drafter = NgramDrafter(memory=memory)
    drafter.begin([1, 40, 41], None)
    draft = drafter.propose([1, 40, 41], 3)
    assert draft.tokens == [42, 43, 44] and all(f.remembered == 1 for f in drafter.notes.get(draft))
    drafter.begin([40, 41, 50, 40, 41], None)  # the context itself says 50 follows 40 41
    assert drafter.propose([40, 41, 50, 40, 41], 1).tokens == [50]


@pytest.fixture()
def own_tiny(tiny_model_dir):
    """A model of this test's own: enabling memory changes what every later generation drafts."""
    return specdec.load(str(tiny_model_dir))


def test_a_second_generation_drafts_from_the_first(own_tiny):
    tiny = own_tiny
    prompt = "zebra yak"
    first = tiny.generate(prompt, max_new_tokens=30, policy="fixed", num_draft=4)
    plain = tiny.generate(prompt, max_new_tokens=30, drafter="none")
    tiny.loaded.enable_memory()
    tiny.generate(prompt, max_new_tokens=30, policy="fixed", num_draft=4)  # fills the memory
    assert len(tiny.loaded.memory) > 0
    second = tiny.generate(prompt, max_new_tokens=30, policy="fixed", num_draft=4)
    assert second.token_ids == first.token_ids == plain.token_ids
    assert second.stats.accepted > first.stats.accepted
    recycled = tiny.generate(prompt, max_new_tokens=30, policy="fixed", num_draft=4, drafter="recycle")
    assert recycled.token_ids == plain.token_ids


def test_cli_memory_file_is_written_and_reused(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "memory.json"
    args = ["generate", "zebra yak", "--model", str(tiny_model_dir), "--max-new-tokens", "30", "--policy", "fixed",
            "--num-draft", "4", "--memory", str(path), "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert json.loads(path.read_text())["format"] == "specdec-memory"
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["token_ids"] == first["token_ids"]
    assert second["stats"]["accepted"] > first["stats"]["accepted"]


def test_cli_refuses_a_memory_path_in_a_missing_folder(capsys, tmp_path, no_loading, tiny_model_dir):
    code = main(["generate", "hi", "--model", str(tiny_model_dir), "--memory", str(tmp_path / "no" / "m.json")])
    assert code == 2 and "memory must be a file in an existing folder" in capsys.readouterr().err
