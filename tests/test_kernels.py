"""Kernel selection: every candidate computes the same product, and routing keeps outputs."""

from __future__ import annotations

import pytest
import torch

from specdec import kernels
from specdec.backends.hf import HFBackend


@pytest.mark.parametrize("name", list(kernels.KERNELS))
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_every_kernel_computes_the_linear_product(name, rows):
    w = torch.randn(40, 24, dtype=torch.float64)
    h = torch.randn(rows, 24, dtype=torch.float64)
    assert torch.allclose(kernels.KERNELS[name](w, h), h @ w.t(), atol=1e-12)


def test_tune_install_uninstall_on_a_model(tiny_llama):
    choices = kernels.tune(tiny_llama, repeats=1)
    shapes = {tuple(m.weight.shape) for m in tiny_llama.modules() if isinstance(m, torch.nn.Linear)}
    assert set(choices) == shapes
    assert all(len(t) == kernels.MAX_ROWS + 1 and set(t) <= set(kernels.KERNELS) for t in choices.values())
    prompt = [1, 5, 9, 13, 17, 4]
    ref = HFBackend(tiny_llama).extend(prompt)
    # Force the non-default kernels everywhere so the routing itself is exercised.
    forced = {s: ["linear", "pair-transposed"] + ["transposed"] * kernels.MAX_ROWS for s in choices}
    kernels.install(tiny_llama, forced)
    try:
        backend = HFBackend(tiny_llama)
        assert torch.allclose(backend.extend(prompt), ref, atol=1e-9)
        assert torch.allclose(backend.extend([7])[0], HFBackend(tiny_llama).extend(prompt + [7])[-1], atol=1e-9)
    finally:
        kernels.uninstall(tiny_llama)
    assert all("forward" not in m.__dict__ for m in tiny_llama.modules())


def test_tuned_choices_are_cached(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    first = kernels.tuned(tiny_llama, "tiny/key")
    monkeypatch.setattr(kernels, "tune", lambda *a, **k: pytest.fail("should read the cache"))
    assert kernels.tuned(tiny_llama, "tiny/key") == first
    assert len(list((tmp_path / "kernels").glob("*.json"))) == 1
