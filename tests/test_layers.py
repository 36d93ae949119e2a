"""The layering of pyproject.toml's import contracts holds (CI also runs `lint-imports`)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the venv's own script first: `venv/bin/python -m pytest` runs without the venv on PATH
_BESIDE = Path(sys.executable).parent / "lint-imports"
LINT_IMPORTS = str(_BESIDE) if _BESIDE.is_file() else shutil.which("lint-imports")


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is not installed (the dev extra)")
def test_import_contracts_are_kept():
    done = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    """No file-level import circle in vapo_lab, type-only imports (under TYPE_CHECKING) included:
    import-linter's contracts see packages, not files, and skip type-only imports."""
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("vapo_lab", exclude_type_checking_imports=False, cache_dir=None)
    graph = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert _cycles(graph) == []
