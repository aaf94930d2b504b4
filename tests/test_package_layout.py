"""The shape of the packages: no import cycles between fray_core's modules, no backend imported by fray_core
or by another backend (each builds on fray_core alone), and the CLI's terminal library never on the
``import fray_core`` path.

A static scan (AST) of every module, so a cycle or a backend import hidden in a function body counts too;
imports under ``if TYPE_CHECKING:`` do not run and are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "fray_core"
BACKENDS = ("fray_local", "fray_ray")
PACKAGES = ("fray_core",) + BACKENDS


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> list[tuple[str, int]]:
    """Every module imported at run time (``from a import b`` gives ``a.b`` and ``a``), with its line."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else [])
                    )
                found.append((base, child.lineno))
                found.extend((f"{base}.{a.name}", child.lineno) for a in child.names)
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = CORE) -> tuple[dict[str, set[str]], list[str]]:
    """(edges between the package's modules, imports of a backend package other than itself, as
    ``module:line name``): for fray_core every backend is forbidden, for a backend every other one."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    backend_imports: list[str] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, line in _imports(ast.parse(path.read_text(), str(path)), package):
            if target.split(".")[0] in BACKENDS and target.split(".")[0] != root.name:
                backend_imports.append(f"{name}:{line} {target}")
            elif target in modules and target != name and not name.startswith(target + "."):
                # importing a submodule runs its package's __init__ first; that is not a dependency of ours
                edges[name].add(target)
    return edges, backend_imports


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph (``[a, b, a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_no_import_cycle_in_fray_core() -> None:
    edges, _ = import_graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle in fray_core: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_a_backend(package: str) -> None:
    # fray_core loads backends by name through the registry (fray_core.cluster._BACKENDS, fray_core.cli.app._COMMANDS);
    # a backend uses fray_core only, so a third one never needs another backend installed
    _, backend_imports = import_graph(CORE.parent / package)
    assert backend_imports == [], backend_imports


def test_the_scan_sees_cycles_and_backend_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "fray_core"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fray_core import c\n"
        "def f():\n    from fray_core.b import x\n"
    )
    (pkg / "b.py").write_text("from fray_core.sub import d\n")
    (pkg / "c.py").write_text("import fray_core.a\n")  # only a TYPE_CHECKING import comes back: no cycle
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from .. import a\nimport fray_ray.cluster\n")
    edges, backend_imports = import_graph(pkg)
    assert edges["fray_core.a"] == {"fray_core.b"}
    assert find_cycle(edges) == ["fray_core.a", "fray_core.b", "fray_core.sub.d", "fray_core.a"]
    assert backend_imports == ["fray_core.sub.d:2 fray_ray.cluster"]
    (pkg / "sub" / "d.py").write_text("")
    assert find_cycle(import_graph(pkg)[0]) is None
    ray_pkg = tmp_path / "fray_ray"
    ray_pkg.mkdir()
    (ray_pkg / "__init__.py").write_text("")
    (ray_pkg / "x.py").write_text(
        "import fray_ray.y\nfrom fray_core import a\ndef f():\n    from fray_local.cluster import z\n"
    )
    assert import_graph(ray_pkg)[1] == ["fray_ray.x:4 fray_local.cluster", "fray_ray.x:4 fray_local.cluster.z"]


@pytest.mark.parametrize("code", ["import fray_core", "import fray_core.cluster, fray_core.types, fray_local"])
def test_importing_fray_core_never_loads_the_cli_terminal_library(code: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or "
            f"m.startswith('fray_core.cli')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "[]"
