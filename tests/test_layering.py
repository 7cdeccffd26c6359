"""The package's import graph: no cycle, and every arrow points down the layers.

    models (and foundations) <- engine <- methods <- entry points

Every ``import`` of a ``jaxrl_mt`` module counts, also one inside a function (a lazy import is
still an arrow) and one under ``if TYPE_CHECKING:`` (a type-only arrow is still a dependency, and
a type-only circle a design circle); an import of a module's own ancestor package does not
(Python imports the package before any of its modules anyway). A new module must be placed in a
layer here; docs/architecture.md and the README's Layout name the same layers (checked below).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "jaxrl_mt"

# layer of each top-level name under jaxrl_mt (a module or a subpackage); lower layers know nothing of higher ones
LAYERS: dict[str, int] = {
    # 0: models and foundations (no engine, no method)
    "models": 0, "checkpointing": 0, "runtime": 0, "cli_errors": 0, "registry": 0, "typed_config": 0,
    "http_safety": 0, "text_safety": 0, "workdir_lock": 0,
    # 1: the engine: generation, scoring, the multi-turn runner and what they are built on
    "batching": 1, "chat": 1, "parallel": 1, "sampling": 1, "scoring": 1, "conversations": 1,
    "strategies": 1, "backends": 1, "local_backend": 1, "remote": 1,
    # 2: methods and their data (data's LLM segmenter uses the backends)
    "data": 2, "rewards": 2, "rl": 2, "eval": 2, "sedt": 2, "tasks": 2, "serving": 2,
    # 3: entry points
    "train": 3, "evaluate": 3, "generate": 3, "export": 3, "serve": 3, "benchmarks": 3,
    "memory_table": 3, "__init__": 3,
}
LAYER_NAMES = ("models", "engine", "methods", "entry points")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The jaxrl_mt modules `name` imports (resolved to modules or packages that exist)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("jaxrl_mt") and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def layer(mod: str) -> int:
    top = mod.split(".")[1] if "." in mod else "__init__"
    if top not in LAYERS:
        raise KeyError(f"{mod}: not placed in a layer (add '{top}' to LAYERS in {Path(__file__).name})")
    return LAYERS[top]


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_every_module_has_a_layer():
    unplaced = []
    for m in modules():
        try:
            layer(m)
        except KeyError as e:
            unplaced.append(str(e))
    assert not unplaced, unplaced


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_arrows_point_down_the_layers():
    bad = [f"{a} ({LAYER_NAMES[layer(a)]}) imports {b} ({LAYER_NAMES[layer(b)]})"
           for a, deps in graph().items() for b in sorted(deps) if layer(b) > layer(a)]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_lazy_imports_and_cycles(tmp_path):
    """The graph reader counts an import inside a function, and the cycle finder finds a 3-cycle."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jaxrl_mt.rl import loop\n"
                   "def f():\n    from jaxrl_mt.sedt import respond\n    import jaxrl_mt.eval.simulator\n")
    known = {"jaxrl_mt.sedt", "jaxrl_mt.eval", "jaxrl_mt.eval.simulator", "jaxrl_mt.rl", "jaxrl_mt.rl.loop"}
    got = imports_of("jaxrl_mt.sampling.fake", src, known)
    assert got == {"jaxrl_mt.sedt", "jaxrl_mt.eval.simulator", "jaxrl_mt.rl.loop"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    with pytest.raises(KeyError, match="not placed in a layer"):
        layer("jaxrl_mt.nowhere")


def _doc_layers(text: str, start: str, stop: str) -> dict[int, set[str]]:
    """Module names per layer in a doc section: each line/row starting with a layer's name."""
    section = text[text.index(start):]
    section = section[:section.index(stop)] if stop in section else section
    out: dict[int, set[str]] = {}
    names = ["entry points", "methods", "engine", "models"]
    current = None
    for line in section.splitlines():
        head = line.strip("|- ").lower()
        for n in names:
            if head.startswith(n):
                current = LAYER_NAMES.index(n)
        if current is not None:
            out.setdefault(current, set()).update(
                m.rstrip("/").removesuffix(".py") for m in re.findall(r"`([a-z_]+(?:/|\.py))`", line))
    return out


@pytest.mark.parametrize("doc, start, stop", [("docs/architecture.md", "| layer | modules", "tests/test_layering.py"),
                                              ("README.md", "## Layout", "Docs: [architecture]")])
def test_docs_name_the_same_layers(doc, start, stop):
    """docs/architecture.md's table and the README's Layout place every top-level module as LAYERS does."""
    got = _doc_layers((ROOT / doc).read_text(encoding="utf-8"), start, stop)
    want: dict[int, set[str]] = {}
    for name, lay in LAYERS.items():
        if name != "__init__":
            want.setdefault(lay, set()).add(name)
    assert got == want


def test_the_package_imports_no_lab_code_and_reads_no_tests():
    """The installed package never imports the repository's `experiments/` (the lab code of the
    CPU experiments, outside the package) or `tests`, nor opens a path under tests/."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            lab = [n for n in names if n.split(".")[0] in ("experiments", "tests")]
            bad += [f"{path.relative_to(ROOT)}: imports {n}" for n in lab]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests/"):
                bad.append(f"{path.relative_to(ROOT)}: path {node.value!r}")
    assert not bad, "\n".join(bad)
    assert not (PKG / "experiments").exists()
