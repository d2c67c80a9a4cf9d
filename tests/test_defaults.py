"""What runs with no flags: Qwen2.5-Coder-1.5B, on the backend chosen for the model (llama.cpp with
exact kernels for a GGUF alias or file, transformers for a transformers folder or a GPU), the
choice said once in one line; a named backend that cannot run the model refused."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.load_options import AUTO, LoadOptions, backend_for
from specdec.models import DEFAULT_MODEL

QWEN = "qwen2.5-coder-1.5b"


@pytest.fixture()
def llamacpp_installed(monkeypatch):
    """Whether llama-cpp-python is importable, as the resolver sees it (set by the test)."""
    def set_to(value: bool) -> None:
        monkeypatch.setattr("specdec.load_options.llamacpp_installed", lambda: value)
    set_to(True)
    return set_to


# -- the resolver ---------------------------------------------------------------------------------
def test_the_default_model_is_qwen_on_auto_everywhere():
    from specdec.cli import build_parser
    from specdec.server.settings import settings_from

    assert DEFAULT_MODEL == QWEN and LoadOptions().backend == AUTO
    assert inspect.signature(specdec.load).parameters["name"].default == QWEN
    for command in (["generate", "hi"], ["bench"], ["serve"], ["vocab", "--draft-model", "x"]):
        assert build_parser().parse_args(command).model == QWEN, command
    assert settings_from({}).model == QWEN


def test_a_gguf_alias_or_file_runs_on_llamacpp(llamacpp_installed, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    for model in (QWEN, "smollm2-135m", str(gguf), "not-yet-downloaded.gguf"):
        assert backend_for(model) == "llamacpp", model
    assert LoadOptions().for_model(QWEN).backend == "llamacpp"


def test_a_transformers_folder_runs_on_transformers(llamacpp_installed, tiny_model_dir):
    assert backend_for(str(tiny_model_dir)) == "transformers"
    assert LoadOptions().for_model(str(tiny_model_dir)).backend == "transformers"


def test_a_gpu_device_runs_the_static_cache_path_on_transformers(llamacpp_installed, monkeypatch):
    """llama.cpp runs on the CPU here: on a GPU the transformers backend's static KV cache with CUDA
    graphs runs every model, a GGUF alias converted once."""
    monkeypatch.setattr("specdec.devices.kind", lambda device: device.split(":")[0].replace("auto", "cuda"))
    for device in ("cuda", "cuda:1", "auto"):
        assert backend_for(QWEN, device=device) == "transformers", device
    assert backend_for(QWEN, device="cpu") == "llamacpp"


def test_a_dtype_llamacpp_does_not_offer_runs_on_transformers(llamacpp_installed):
    assert backend_for(QWEN, dtype="bfloat16") == "transformers"
    assert LoadOptions(dtype="bfloat16").for_model(QWEN).backend == "transformers"


def test_without_llamacpp_a_gguf_runs_on_transformers(llamacpp_installed):
    llamacpp_installed(False)
    assert backend_for(QWEN) == "transformers"


def test_a_named_backend_is_kept_and_one_that_cannot_run_the_model_is_refused(llamacpp_installed, tiny_model_dir):
    assert backend_for(QWEN, "transformers") == "transformers"
    assert backend_for(str(tiny_model_dir), "transformers") == "transformers"
    with pytest.raises(SpecdecError, match=r"^backend llamacpp runs a GGUF file .* use backend transformers$"):
        backend_for(str(tiny_model_dir), "llamacpp")
    with pytest.raises(SpecdecError, match=r"^backend llamacpp runs a GGUF file"):
        LoadOptions(backend="llamacpp").for_model(str(tiny_model_dir))


def test_the_cli_refuses_a_backend_that_cannot_run_the_model_in_one_line(capsys, no_loading, tiny_model_dir):
    assert main(["generate", "hi", "--model", str(tiny_model_dir), "--backend", "llamacpp"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: --backend llamacpp runs a GGUF file (an alias or a .gguf path), and "
                                        f"{tiny_model_dir} is a transformers folder: use --backend transformers"]
    assert no_loading == []


def test_llamacpp_kernels_in_words():
    from specdec.backends.llamacpp import kernels_in_words

    def weights(exact: bool, n_ubatch: int = 512):
        return SimpleNamespace(exact=exact, n_ubatch=n_ubatch, n_batch=512)

    assert kernels_in_words(weights(True), 3) == "exact, patched multi-row kernels"
    assert kernels_in_words(weights(True, 3), 0) == "exact, stock llama.cpp kernels, at most 3 rows a micro-batch"
    assert kernels_in_words(weights(True, 1), 2) == "exact, patched multi-row kernels, at most 1 row a micro-batch"
    assert kernels_in_words(weights(False), 3).startswith("fast kernels, not batch-invariant")


# -- the line that says what was chosen -----------------------------------------------------------
def choice_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("specdec: ") and " on " in line]


def test_the_cli_says_once_which_backend_and_kernels_it_chose(capsys, tiny_model_dir, tiny_draft_dir):
    """One line for the target, none for the draft model it loads on the same backend."""
    code = main(["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--max-new-tokens", "4",
                 "--drafter", "model", "--draft-model", str(tiny_draft_dir), "--json"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert choice_lines(err) == [f"specdec: {tiny_model_dir.name} on transformers (float32, this CPU's tuned "
                                 "matmul kernels)"]
    # A backend named: nothing to say.
    code = main(["generate", "the quick brown fox", "--model", str(tiny_model_dir), "--max-new-tokens", "4",
                 "--backend", "transformers", "--json"])
    err = capsys.readouterr().err
    assert code == 0 and choice_lines(err) == [], err


def test_the_api_reports_its_choice_once(tiny_model_dir):
    said: list[str] = []
    model = specdec.load(str(tiny_model_dir), report=said.append)
    assert said == [model.loaded.choice] and model.loaded.backend_name == "transformers"
    assert said[0].startswith(f"{tiny_model_dir.name} on transformers (float32")
    said.clear()
    specdec.load(str(tiny_model_dir), backend="transformers", report=said.append)
    assert said == []


# -- end to end -----------------------------------------------------------------------------------
@pytest.mark.real
def test_generate_with_no_model_or_backend_runs_qwen_on_exact_llamacpp():
    """``specdec generate "Write a haiku" --chat`` as a newcomer types it: Qwen2.5-Coder-1.5B on
    llama.cpp with exact kernels, the choice said in one line."""
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend is an optional extra (make setup installs it)")
    from specdec.backends.llamacpp_lib import kernel_generation

    # The specdec under test, wherever the run's working folder and installed copy are.
    path = os.pathsep.join(p for p in (str(Path(specdec.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "Write a haiku", "--chat",
                           "--max-new-tokens", "8"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "100", "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    kernels = "exact, patched multi-row kernels" if kernel_generation() else "exact, stock llama.cpp kernels"
    lines = choice_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"specdec: {QWEN} on llama.cpp ({kernels}"), proc.stderr
    assert "new tokens" in proc.stderr
