"""The Colab notebooks run top to bottom, headless (nbclient), on the CPU backend.

Default run: each notebook on the tiny random chat model (real tokenizer and chat template),
`JAXRL_MT_NOTEBOOK_MODEL` pointing at it and short budgets (`JAXRL_MT_NOTEBOOK_SMALL=1`).
Slow run: the same notebooks on the embedded SmolLM2-135M-Instruct, as a user runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("01_quickstart", "02_rlsta_steps", "03_lic_eval")


def execute(name: str, timeout: int) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def outputs(nb: nbformat.NotebookNode) -> str:
    text = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text.append(o.get("text", "") or json.dumps(o.get("data", {})))
    return "\n".join(text)


def test_notebooks_are_valid_and_guard_their_install_cell() -> None:
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        install = nb.cells[1].source
        assert 'find_spec("google.colab")' in install and "if IN_COLAB:" in install, name
        magic = [line for line in install.splitlines() if line.lstrip().startswith(("!", "%"))]
        assert all(line.startswith("    ") for line in magic), name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: stored outputs"


@pytest.fixture
def tiny_env(tiny_chat_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXRL_MT_NOTEBOOK_MODEL", str(tiny_chat_model_dir))
    monkeypatch.setenv("JAXRL_MT_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def test_quickstart_on_tiny_model(tiny_env) -> None:
    out = outputs(execute("01_quickstart", 600))
    assert "tiny-chat-llama" in out and "geometric-mean likelihood" in out and "cosine(apples, train)" in out


@pytest.mark.slow  # 41 s: the suite budget (issue 52); the quickstart and LiC notebooks stay in CI
def test_rlsta_steps_on_tiny_model(tiny_env) -> None:
    out = outputs(execute("02_rlsta_steps", 900))
    table = [line.split() for line in out.splitlines() if line.startswith("   1  ") or line.startswith("   2  ")]
    assert [row[0] for row in table] == ["1", "2"] and all(len(row) == 8 for row in table), table
    assert "checkpoints: ['1', '2']" in out  # one orbax checkpoint per step


@pytest.mark.slow  # the suite budget (issue 52): 21 s; the quickstart notebook stays in CI
def test_lic_eval_with_and_without_sedt_on_tiny_model(tiny_env) -> None:
    out = outputs(execute("03_lic_eval", 900))
    for strategy in ("plain", "sedt"):
        for kind in ("full", "sharded"):
            assert f"{strategy:8s} {kind:8s}" in out, (strategy, kind)
    assert "Here is everything I told you" in out  # SeDT's annotated final prompt


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_on_embedded_model(name: str, monkeypatch: pytest.MonkeyPatch, embedded_model) -> None:
    monkeypatch.delenv("JAXRL_MT_NOTEBOOK_MODEL", raising=False)
    monkeypatch.delenv("JAXRL_MT_NOTEBOOK_SMALL", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    out = outputs(execute(name, 1800))
    assert "builtin:smollm2-135m-instruct" in out
