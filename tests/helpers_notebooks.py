"""Small notebooks written by tests: a ``parameters`` cell plus code cells, with the kernelspec and language
metadata papermill insists on."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def write_notebook(path: Path, parameters: str, *cells: str) -> Path:
    nb = new_notebook(cells=[new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                             *(new_code_cell(c) for c in cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return path


def assert_notebook_pair_in_sync(name: str, params, notebooks: Path = NOTEBOOKS) -> None:
    """notebooks/<name>.ipynb and its jupytext pair notebooks/<name>.py (percent format) hold the same cells (type,
    source, tags); the .ipynb is committed without outputs, with the kernelspec and language metadata papermill
    needs, and one ``parameters`` cell assigning each of ``params``, every assignment visible to papermill (it skips
    a line with a second "=", e.g. in a comment, so run_dir would never be injected)."""
    import ast

    import jupytext
    import nbformat

    from brorl_lab.lab.sweep import notebook_parameters

    committed = notebooks / f"{name}.ipynb"
    nb = nbformat.read(committed, as_version=4)
    text = jupytext.read(notebooks / f"{name}.py")

    def cells(n):
        return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in n.cells]

    fix = f"sync them: jupytext --sync notebooks/{name}.ipynb (or edit in JupyterLab, which keeps the pair)"
    assert cells(nb) == cells(text), fix
    assert nb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", fix
    assert nb.metadata.kernelspec.name == "python3" and nb.metadata.language_info.name == "python"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"clear the outputs of {committed.name}"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and all(f"{k} =" in tagged[0].source for k in params)
    assigned = {t.id for node in ast.parse(tagged[0].source).body for t in node.targets}
    assert set(notebook_parameters(committed)) == assigned


PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
BUILDER = NOTEBOOKS.parent / "docs" / "book" / "build_book.py"


def book_builder():
    """docs/book/build_book.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_book", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_preset(stem: str) -> dict:
    """The parameters the tiny book runs notebooks/<stem> with (docs/book/presets.yml): the size its tests read."""
    return dict(book_builder().load_presets("tiny")[stem])


def read_outputs(path: Path) -> dict:
    """An executed notebook's code outputs: ``outputs`` (all), ``kinds`` (display mime types), ``text`` (stream
    text) and ``figures`` (plotly JSON), after asserting no cell raised."""
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o for o in outputs if o.output_type in ("display_data", "execute_result")]
    return {"outputs": outputs, "kinds": [k for o in shown for k in o.data],
            "text": "".join(o.get("text", "") for o in outputs if o.output_type == "stream"),
            "figures": [o.data[PLOTLY] for o in shown if PLOTLY in o.data]}


def executed_in_book(out: Path, stem: str) -> dict:
    """notebooks/<stem> as the tiny book executes it, read from the book folder ``out`` (its ``executed/`` copy),
    executed here first by the builder's own ``execute`` when the book has not run it yet: same preset, same cache
    key, same kernel environment (text progress bars), cwd ``out/work``. The tiny book's build (tests/test_book.py,
    the same folder: tests/conftest.py's ``tiny_book_out``) then finds it cached, so a notebook the book shows is
    executed once per test session and its tests read the very outputs the book renders. Returns
    :func:`read_outputs` plus ``work``, the folder its relative run directories are in."""
    book = book_builder()
    params = book.load_presets("tiny")[stem]
    assert not book.reads_runs(params), f"{stem} reads the other notebooks' runs: only the whole book runs it"
    key = book.notebook_key(stem, params, "tiny", book.code_digest(), [])
    if not book.cached(stem, key, out):
        book.execute(stem, params, key, out, "tiny")
    return {**read_outputs(out / "executed" / f"{stem}.ipynb"), "work": out / "work"}


def execute_small(notebook: Path, tmp_path: Path, parameters: dict, monkeypatch) -> dict:
    """Run ``notebook`` headless under papermill with ``parameters`` (cwd ``tmp_path``, one OpenMP thread in the
    kernel) and return its code outputs: ``outputs`` (all), ``kinds`` (display mime types), ``text`` (stream text)
    and ``figures`` (plotly JSON), after asserting no cell raised."""
    import papermill

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel is a child process; keep it to one core
    out = tmp_path / f"{notebook.stem}_out.ipynb"
    papermill.execute_notebook(str(notebook), str(out), parameters=parameters, kernel_name="python3",
                               cwd=str(tmp_path), progress_bar=False)
    return read_outputs(out)


def exercise_names(notebook: Path) -> list[str]:
    """The functions defined in a notebook's cells tagged ``exercise``, in order; each must be followed by a cell
    tagged ``check`` before the next exercise, and have a solution of the same name in notebooks/solutions/."""
    import ast

    from brorl_lab.lab.course import load_solutions

    cells = nbformat.read(notebook, as_version=4).cells
    names, pending = [], False
    for c in cells:
        tags = c.metadata.get("tags", [])
        if "exercise" in tags:
            assert not pending, f"exercise {names[-1]} has no check cell before the next exercise"
            names += [n.name for n in ast.parse(c.source).body if isinstance(n, ast.FunctionDef)]
            pending = True
        elif "check" in tags:
            pending = False
    assert not pending, f"exercise {names[-1]} has no check cell"
    solutions = load_solutions(notebook.stem)
    assert all(callable(getattr(solutions, n, None)) for n in names), f"a solution is missing for {notebook.stem}"
    return names
