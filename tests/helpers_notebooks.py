"""Small notebooks written by tests: a ``parameters`` cell plus code cells, with the kernelspec and language
metadata papermill insists on."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook


def write_notebook(path: Path, parameters: str, *cells: str) -> Path:
    nb = new_notebook(cells=[new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                             *(new_code_cell(c) for c in cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return path


def assert_committed_notebook_is_generated(tmp_path: Path, name: str, params) -> None:
    """notebooks/<name>.ipynb is exactly what notebooks/build_<name>.py writes: outputs cleared, kernelspec and
    language metadata set, one ``parameters`` cell assigning each of ``params``, every assignment visible to
    papermill (it skips a line with a second "=", e.g. in a comment, so run_dir would never be injected)."""
    import ast
    import subprocess
    import sys

    import nbformat

    from brorl_lab.lab.sweep import notebook_parameters

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    fresh = tmp_path / "fresh.ipynb"
    subprocess.run([sys.executable, str(notebooks / f"build_{name}.py"), str(fresh)], check=True, capture_output=True)
    committed = notebooks / f"{name}.ipynb"
    assert fresh.read_text() == committed.read_text(), f"regenerate: python notebooks/build_{name}.py"
    nb = nbformat.read(committed, as_version=4)
    assert nb.metadata.kernelspec.name == "python3" and nb.metadata.language_info.name == "python"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and all(f"{k} =" in tagged[0].source for k in params)
    assigned = {t.id for node in ast.parse(tagged[0].source).body for t in node.targets}
    assert set(notebook_parameters(committed)) == assigned
