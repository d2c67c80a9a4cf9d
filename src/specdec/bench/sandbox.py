"""Run a HumanEval problem's tests on code a model wrote, outside our process.

The code is never imported here: it is written with the problem's tests into a temporary folder and
run by a fresh interpreter in isolated mode (``-I``: no site-packages of the user, no current folder
on the path), with a wall-clock limit and, on POSIX, limits on its memory, CPU time, file size and
processes. What comes back is whether the tests passed and the tail of what it printed, which a
repair loop shows the model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

TIME_LIMIT_S = 10.0
MEMORY_LIMIT = 1 << 30  # bytes of address space
FEEDBACK_LINES = 12


@dataclass(frozen=True)
class TestOutcome:
    """Whether the tests passed, and the last lines of the run's output (a traceback, usually)."""

    passed: bool
    output: str


def program(code: str, test: str, entry_point: str) -> str:
    """The file that runs: the model's code, the problem's ``check`` and a call of it."""
    return f"{code}\n\n{test}\n\ncheck({entry_point})\n"


def _limits() -> None:  # pragma: no cover - runs in the child before exec
    import resource

    cpu = int(TIME_LIMIT_S) + 1
    for limit, value in ((resource.RLIMIT_AS, MEMORY_LIMIT), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_FSIZE, 1 << 20)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass


def run_tests(code: str, test: str, entry_point: str, time_limit_s: float = TIME_LIMIT_S) -> TestOutcome:
    """Run ``test`` (a HumanEval ``check(candidate)`` function) on ``entry_point`` of ``code`` in a
    subprocess; a crash, a timeout or a failed assertion is a failure with its output."""
    with tempfile.TemporaryDirectory(prefix="specdec-tests-") as folder:
        path = os.path.join(folder, "solution.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program(code, test, entry_point))
        proc = subprocess.Popen([sys.executable, "-I", path], cwd=folder, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_limits if os.name == "posix" else None,
                                start_new_session=True,  # its own process group: a timeout kills all it started
                                env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"})
        try:
            output, _ = proc.communicate(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return TestOutcome(False, f"Timed out after {time_limit_s:g} seconds.")
    lines = output.replace(folder, ".").strip().splitlines()[-FEEDBACK_LINES:]
    if proc.returncode != 0 and not lines:
        lines = [f"The program exited with status {proc.returncode}."]
    return TestOutcome(proc.returncode == 0, "\n".join(lines))


def _kill(proc: subprocess.Popen) -> None:
    """The child and whatever it started (its own process group on POSIX)."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()
    except ProcessLookupError:
        pass
    proc.communicate()
