"""How the package is laid out: imports flow one way (no cycles among specdec's modules), and every
declared dependency is one specdec uses.

Imports are read from the source with ``ast``, every one of them: module level, inside functions
and under ``TYPE_CHECKING``, since each says that one module needs the other.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of specdec by dotted name: (file, is a package's __init__)."""
    found = {}
    for path in (SRC / "specdec").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imported(tree: ast.AST, package: str) -> set[str]:
    """The dotted names ``tree`` imports; ``from a import b`` gives ``a.b`` (a module, or a name
    in module ``a``: the caller keeps the longest part that is a module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the specdec modules it imports (a name in a package counts as the package)."""
    found = modules()

    def module_of(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, package) in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {module_of(n) for n in imported(tree, name if package else name.rpartition(".")[0])
                   if n == "specdec" or n.startswith("specdec.")}
        graph[name] = frozenset(t for t in targets if t and t != name)
    return graph


def cycles(graph: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def report(found: list[list[str]]) -> str:
    return "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_the_reader_finds_a_cycle():
    """Negative control: two modules that import each other (one inside a function, one under
    TYPE_CHECKING) are one cycle; a one-way import is none."""
    a = ast.parse("def f():\n    from specdec.b import g\n")
    b = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specdec import a\n")
    assert "specdec.b.g" in imported(a, "specdec") and "specdec.a" in imported(b, "specdec")
    assert cycles({"specdec.a": {"specdec.b"}, "specdec.b": {"specdec.a"}}) == [["specdec.a", "specdec.b"]]
    assert cycles({"specdec.a": {"specdec.b"}, "specdec.b": set()}) == []
    assert imported(ast.parse("from .. import options"), "specdec.server") == {"specdec.options"}


def test_imports_flow_one_way():
    found = cycles(import_graph())
    assert not found, report(found)


def test_what_drafters_share_imports_no_drafter():
    """drafting/ sits below drafters/: a drafter may use what it shares, never the other way (the
    n-gram index once lived in a drafter that drafting/ borrowed it from)."""
    graph = import_graph()
    upward = sorted(f"{m} -> {t}" for m in graph if m.startswith("specdec.drafting")
                    for t in graph[m] if t.startswith("specdec.drafters"))
    assert not upward, "drafting/ imports drafters/:\n" + "\n".join(upward)


# -- dependencies ----------------------------------------------------------------------------------
# Declared but not imported by specdec, because a library specdec calls needs them at run time.
NEEDED_BY_OTHERS = {
    # transformers' from_pretrained(gguf_file=...) (the GGUF -> safetensors conversion in models.py)
    # raises "accelerate is required when loading a GGUF file" without it.
    "accelerate": "transformers",
}


def _distribution(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def top_level_modules(distribution: str) -> set[str]:
    """The names an installed distribution can be imported by (from its file list)."""
    from importlib.metadata import distribution as installed

    names = set()
    for file in installed(distribution).files or ():
        first = file.parts[0]
        if len(file.parts) > 1 and not first.endswith((".dist-info", ".data")) and first != "..":
            names.add(first)
        elif file.suffix == ".py" and len(file.parts) == 1:
            names.add(file.stem)
    return names


def test_every_declared_dependency_is_used():
    declared = [_distribution(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                ["dependencies"]]
    top = set()
    for module, (path, package) in modules().items():
        for name in imported(ast.parse(path.read_text(encoding="utf-8")),
                             module if package else module.rpartition(".")[0]):
            top.add(name.partition(".")[0])
    used = {d for d in declared + list(NEEDED_BY_OTHERS.values())
            if d.replace("-", "_") in top or top_level_modules(d) & top}  # file lists only where names differ
    unused = [d for d in declared if d not in used and d not in NEEDED_BY_OTHERS]
    assert not unused, f"declared in pyproject.toml, imported nowhere in src/specdec: {unused}"
    for name, user in NEEDED_BY_OTHERS.items():
        assert name in declared and user in used, (name, user)


def test_a_registry_scans_past_a_helper_whose_optional_library_is_missing(tmp_path, monkeypatch):
    """A module of a registered package that imports an optional accelerator's library at the top
    (the paged attention's Triton kernels) is skipped where the library is missing, and the others
    register; a module missing one of specdec's own modules still fails the scan."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def package(name: str, kernels: str):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "__init__.py").write_text("from specdec.registry import Registry\n"
                                            f"REG = Registry('thing', {name!r})\n")
        (folder / "a_kernels.py").write_text(kernels)
        (folder / "b_entry.py").write_text(f"from {name} import REG\nREG.add('b', 'entry')\n")
        return __import__(name).REG

    assert package("optional_pkg", "import a_library_nobody_installed\n").names() == ["b"]
    with pytest.raises(ModuleNotFoundError):
        package("broken_pkg", "import specdec.a_module_that_is_not_there\n").names()


def test_threads_that_read_a_registry_first_at_once_all_find_its_entries(tmp_path, monkeypatch):
    """Generations started together on threads read the drafters' registry at once: each waits
    for the one discovery instead of reading it half done ("unknown drafter 'ngram': use one of
    none")."""
    import threading

    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "slow_pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("from specdec.registry import Registry\nREG = Registry('thing', 'slow_pkg')\n")
    (folder / "a_fast.py").write_text("from slow_pkg import REG\nREG.add('a', 'fast')\n")
    (folder / "b_slow.py").write_text("import time\nfrom slow_pkg import REG\ntime.sleep(0.3)\nREG.add('b', 'slow')\n")
    reg = __import__("slow_pkg").REG
    found: list = []

    def read() -> None:
        try:
            found.append(reg.get("b"))
        except Exception as exc:  # noqa: BLE001 - the failure is what the test looks for
            found.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert found == ["slow"] * 4
