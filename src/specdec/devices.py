"""Where a model runs: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``, checked against what this machine has.

A device is named by its *kind* (``cpu``, ``cuda``) in a backend's registry entry and by its full
name (``cuda:1``) in the load options. Measurements that depend on the hardware (cost curves) are
keyed by :func:`device_tag`: the CPU's model and vector level on a CPU, the GPU's name on a GPU, so
one machine's numbers never steer another's drafts.
"""

from __future__ import annotations

import re

from specdec.errors import SpecdecError

KINDS = ("cpu", "cuda")
_FORM = re.compile(r"^(cpu|auto|cuda)(:(\d+))?$")


def form_problem(device: str) -> str | None:
    """What is wrong with how ``device`` is written (phrased to follow the option's name); None if fine."""
    match = _FORM.match(device)
    if match is None or (match.group(2) and match.group(1) != "cuda"):
        return "must be cpu, cuda, cuda:N or auto"
    return None


def kind(device: str) -> str:
    """``cpu`` or ``cuda`` (``auto`` resolves first: :func:`resolve`)."""
    return resolve(device).split(":")[0]


def cuda_count() -> int:
    """CUDA devices this process can use (0 with a CPU build of PyTorch)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):  # a driver that fails to initialise counts as none
        return 0


def resolve(device: str) -> str:
    """The full name of ``device`` on this machine: ``auto`` is the first GPU if there is one, else
    ``cpu``; ``cuda`` is ``cuda:0``. A GPU that is not there is refused with what there is."""
    problem = form_problem(device)
    if problem:
        raise SpecdecError(f"device {problem}, got {device!r}")
    if device == "cpu":
        return "cpu"
    count = cuda_count()
    if device == "auto":
        return "cuda:0" if count else "cpu"
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = "no CUDA device (a CPU build of PyTorch, or no GPU)" if count == 0 else \
            f"{count} CUDA device{'s' if count > 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
        raise SpecdecError(f"device {device} is not present: this machine has {have}; use --device cpu")
    return f"cuda:{index}"


def device_tag(device: str) -> str:
    """What measured speeds on ``device`` depend on: the GPU's name, or the CPU's (:func:`machine_tag`)."""
    resolved = resolve(device)
    if resolved == "cpu":
        from specdec.cpu import machine_tag

        return machine_tag()
    import torch

    return re.sub(r"\s+", "_", torch.cuda.get_device_name(int(resolved.partition(":")[2])))


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a GPU runs asynchronously: a timing must wait for it)."""
    if kind(device) == "cuda":
        import torch

        torch.cuda.synchronize(resolve(device))
