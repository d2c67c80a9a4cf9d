"""Kernel selection: every candidate computes the same product; tuning swaps modules specdec owns
and can be undone."""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from specdec import kernels
from specdec.backends.hf import HFBackend


@pytest.mark.parametrize("name", list(kernels.KERNELS))
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_every_kernel_computes_the_linear_product(name, rows):
    w = torch.randn(40, 24, dtype=torch.float64)
    h = torch.randn(rows, 24, dtype=torch.float64)
    assert torch.allclose(kernels.KERNELS[name](w, h), h @ w.t(), atol=1e-12)


def test_tune_install_undo_on_a_model(tiny_llama):
    choices = kernels.tune(tiny_llama, repeats=1)
    shapes = {tuple(m.weight.shape) for m in tiny_llama.modules() if isinstance(m, torch.nn.Linear)}
    assert set(choices) == shapes
    assert all(len(t) == kernels.MAX_ROWS + 1 and set(t) <= set(kernels.KERNELS) for t in choices.values())
    prompt = [1, 5, 9, 13, 17, 4]
    ref = HFBackend(tiny_llama).extend(prompt)
    keys = list(tiny_llama.state_dict())
    originals = {name: m for name, m in tiny_llama.named_modules() if type(m) is torch.nn.Linear}
    # Force the non-default kernels everywhere so the routing itself is exercised.
    forced = {s: ["linear", "pair-transposed"] + ["transposed"] * kernels.MAX_ROWS for s in choices}
    handle = kernels.install(tiny_llama, forced)
    try:
        swapped = {name: m for name, m in tiny_llama.named_modules() if name in originals}
        assert all(type(m) is kernels.TunedLinear for m in swapped.values())
        assert all(swapped[n].weight is originals[n].weight for n in originals)  # shared, not copied
        assert list(tiny_llama.state_dict()) == keys  # checkpoints load and save as before
        backend = HFBackend(tiny_llama)
        assert torch.allclose(backend.extend(prompt), ref, atol=1e-9)
        assert torch.allclose(backend.extend([7])[0], HFBackend(tiny_llama).extend(prompt + [7])[-1], atol=1e-9)
    finally:
        handle.undo()
    assert {name: m for name, m in tiny_llama.named_modules() if name in originals} == originals
    assert all("forward" not in m.__dict__ for m in tiny_llama.modules())


def test_subclasses_of_linear_are_left_alone(tiny_llama):
    class Special(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Special(4, 4))
    handle = kernels.install(model, {(4, 4): ["linear"] * (kernels.MAX_ROWS + 1)})
    assert type(model[0]) is kernels.TunedLinear and type(model[1]) is Special
    handle.undo()
    assert type(model[0]) is torch.nn.Linear


def test_a_model_you_loaded_is_not_tuned_unless_asked(tiny_llama):
    tok = None
    model = specdec.Model.from_hf("mine", tiny_llama, tok)
    assert model.loaded.kernel_tuning is None
    assert not any(type(m) is kernels.TunedLinear for m in tiny_llama.modules())


def test_tuned_choices_are_cached(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    first = kernels.tuned(tiny_llama, "tiny/key")
    monkeypatch.setattr(kernels, "tune", lambda *a, **k: pytest.fail("should read the cache"))
    assert kernels.tuned(tiny_llama, "tiny/key") == first
    assert len(list((tmp_path / "kernels").glob("*.json"))) == 1


@pytest.mark.parametrize("content", ["{not json", '{"4x4": "oops"}', "[]", ""])
def test_a_corrupt_kernel_cache_is_measured_again(tmp_path, monkeypatch, tiny_llama, content):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    path = tmp_path / "kernels" / "tiny_key.json"
    path.parent.mkdir()
    path.write_text(content)
    choices = kernels.tuned(tiny_llama, "tiny/key")
    assert json.loads(path.read_text())  # healed: rewritten with a real table
    assert set(choices) == {tuple(m.weight.shape) for m in tiny_llama.modules() if isinstance(m, torch.nn.Linear)}
