"""Build the book: every notebook executed with its outputs, the theory and the results pages, as static HTML that
needs no network (`make book`; open build/book/html/index.html).

    python docs/book/build_book.py                      # the "book" preset into build/book/
    python docs/book/build_book.py --preset tiny --out /tmp/b   # seconds per notebook (tests/test_book.py)

Two stages, each a well-kept Jupyter tool:

1. **papermill** executes each notebook with its preset's parameters (docs/book/presets.yml; myst-nb's own
   executors, jupyter-cache included, cannot inject papermill parameters), one after another, in one work folder
   (<out>/work) so that 04_sweep_analysis reads the runs 02, 03 and 05 wrote. An executed notebook is kept in
   <out>/executed/ with a key: the SHA-256 of the notebook, its parameters, the preset, this file, and every source
   file of brorl_lab/ (the outputs come from that code). A notebook whose key has not changed is not run again; 04's
   key includes the others' keys. ``--force`` runs them all.
2. **Sphinx + myst-nb** (execution off) renders the executed notebooks and the Markdown pages with the
   sphinx-book-theme. Everything a page loads is in the build: plotly.js once as _static/plotly.min.js (from the
   installed plotly; the per-notebook inert copy brorl_lab.lab.plots embeds is dropped), MathJax 2 from the
   jupyter-server-mathjax package, no ipywidgets CDN scripts (myst-nb's nb_ipywidgets_js is emptied).

Progress bars: the kernels start with docs/book/text_bars.py as IPython startup file (<out>/ipython): tqdm.auto draws
a text bar that writes one line when it closes ("N sweep: 100%|##########| 2/2 [...]"), rather than a widget that a
static page shows frozen at 0%. Interactive widgets (the explorers, the live dashboard) need a
kernel: the page says so where a widget was displayed.

How long (measured 2026-12-06 on the shared 2-core machine while other jobs kept its load average at 8 to 15, so a
quiet machine takes less): the tiny preset, every notebook executed, 324 s at load 8 and 791 to 855 s at load 14;
the book preset, per notebook: 00 39 s, 01 345 s, 01b 149 s, 02 2,798 s (47 min: the flagship's arms, 2 seeds),
03 64 s, 05 53 s, 06 728 s (a 3-setting preset since replaced by its quick preset), 04 10 s: 4,204 s (70 min) in
all; Sphinx alone 8 to 18 s. A rebuild with nothing changed executes nothing
(about 20 s); a change under brorl_lab/ re-executes every notebook.
Measured again 2026-12-07 (load 20 to 25 from other jobs): the tiny preset from scratch, 10 notebooks, 903 s (00 78 s,
01 79, 01b 94, 01c 67, 02 110, 03 101, 04 32, 05 49, 06 206, 07 42; Sphinx 28); again at load ~23, 874 s.
**The book preset from scratch** (`nice -n 10 python docs/book/build_book.py --preset book --force`, 2026-12-07
05:35 to 06:26 UTC, load average 6 at the start, 18.8 on average, up to 30, from four other engineers' jobs and a
background study): **50 min 39 s** wall, 12.4 min of CPU (706 s user + 39 s system, kernels included). Per notebook:
00 32 s, 01 144, 01b 158, 01c 38, 02 770, 03 133, 05 80, 06 127, 07 1,451, 04 52; Sphinx 27. Over the 25 minutes
aimed at: the time went to 07 (24 min: its loop at the defaults, 450 steps of 32 x 16 from the takeoff base, about 5
min of CPU on one thread) and 02 (13 min: the flagship miniature, both branch points, 3 seeds). The whole build used
12.4 min of CPU, so the rest of the wall time was waiting for the shared cores; no quiet machine was there to time.
**Quiet, from a fresh clone** (`OMP_NUM_THREADS=1 python docs/book/build_book.py --preset book` in a new clone of
fb988e6, the env built, the machine otherwise idle, 2026-12-07 14:04 UTC; `bench/results/book_2026-12-07.json`):
**11 min 33 s** wall (690 s by the builder's own clock), 12.9 min of CPU. Per notebook: 00 20 s, 01 47, 01b 46,
01c 19, 02 119, 03 39, 05 27, 06 31, 07 317, 04 10; Sphinx 9. Within the 25 minutes aimed at.

Why the committed notebooks stay without outputs and the book is where they are read executed: an executed notebook
carries each plotly figure twice (its JSON and an HTML twin) plus the 4.8 MB plotly.js, 5 to 20 MB per notebook
even at the tiny sizes (01: 20 MB, 15 MB of it its explorer widgets' state), rewritten on every run (diff noise,
repository growth), and a code host's notebook viewer runs no JavaScript, so it would still show no plotly figure;
the README's PNGs (notebooks/figures/) are what a code host shows. tests/ check that the committed .ipynb hold no
outputs.

Bad input (an unknown preset, a notebook without a preset, a parameter its notebook does not declare): one line
naming it and what is allowed, exit 2, nothing built so far removed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parents[1]
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT))  # this checkout's brorl_lab, whichever copy the venv installed
PRESETS = BOOK / "presets.yml"
SOURCES = ("conf.py", "index.md")  # copied from docs/book/ into the Sphinx source folder
# the Markdown pages (every docs/*.md: the theory, the recipes, the study, the reference pages; the results pages; the
# README), and the figures they show; at the same paths as in the repository, so their relative links resolve
PAGES = ("README.md", "docs", "notebooks/figures")
NOT_PAGES = ("book",)  # docs/book is the book's own sources
WIDGET = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_NOTE = ("*An interactive widget is drawn here when the notebook runs in JupyterLab (`make lab`); a static "
               "page has no kernel behind it. The figures right below are its plots as the executed notebook left "
               "them (its default view), kept from the notebook's saved widget state.*")
#: the note where a widget's saved state holds no figure to keep (its traces were added after it was built: plotly
#: sends those as a message whose content the saved state does not keep)
WIDGET_NOTE_BARE = ("*An interactive widget is drawn here when the notebook runs in JupyterLab (`make lab`); a static "
                    "page has no kernel behind it, and its plots could not be kept: the saved widget state holds no "
                    "figure data for them.*")
TEXT_BARS = BOOK / "text_bars.py"  # the kernels' IPython startup file: tqdm.auto draws a text bar, once, at close


class BookError(Exception):
    """Bad input: the message names the field and what is allowed."""


def load_presets(preset: str, path: Path = PRESETS) -> dict[str, dict]:
    """``{notebook stem: parameters}`` for ``preset``, one entry for every notebook in notebooks/ (checked against
    each notebook's parameters cell)."""
    from brorl_lab.core.validation import UserError
    from brorl_lab.lab.sweep import check_parameters

    presets = yaml.safe_load(path.read_text())
    if preset not in presets:
        raise BookError(f"--preset: got {preset!r}; allowed: {', '.join(presets)}")
    chosen = presets[preset] or {}
    stems = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    missing, extra = sorted(set(stems) - set(chosen)), sorted(set(chosen) - set(stems))
    if missing or extra:
        raise BookError(f"{path.name} preset {preset!r}: " + "; ".join(
            [f"no entry for notebook(s) {', '.join(missing)}"] * bool(missing)
            + [f"entries without a notebook: {', '.join(extra)}"] * bool(extra))
            + f"; allowed: one entry per notebook in notebooks/ ({', '.join(stems)})")
    for stem in stems:
        try:
            check_parameters(NOTEBOOKS / f"{stem}.ipynb", chosen[stem] or {})
        except UserError as e:
            raise BookError(f"{path.name} preset {preset!r}, {stem}: {e}") from e
    return {stem: dict(chosen[stem] or {}) for stem in stems}


def reads_runs(params: dict) -> bool:
    """A notebook that reads what the others wrote (04: ``runs_root``) runs last and reruns when any of them did."""
    return "runs_root" in params


def code_digest() -> str:
    """SHA-256 over the kernels' startup file and every file brorl_lab/ imports or reads (.py, .json, .yml): what
    the outputs depend on besides the notebook and its parameters (not this file: staging and rendering are redone
    on every build)."""
    h = hashlib.sha256(TEXT_BARS.read_bytes())
    for p in sorted((ROOT / "brorl_lab").rglob("*")):
        if p.suffix in (".py", ".json", ".yml", ".yaml") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(ROOT)).encode() + p.read_bytes())
    return h.hexdigest()


def notebook_key(stem: str, params: dict, preset: str, code: str, upstream: list[str]) -> str:
    h = hashlib.sha256((NOTEBOOKS / f"{stem}.ipynb").read_bytes())
    h.update(json.dumps([params, preset, code, upstream], sort_keys=True).encode())
    return h.hexdigest()


def kernel_env(out: Path) -> dict:
    """The kernels' environment: this checkout first on the path, one OpenMP thread, the text-bar startup file."""
    startup = out / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    shutil.copy(TEXT_BARS, startup / "00_text_bars.py")
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"IPYTHONDIR": str(out / "ipython"), "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def execute(stem: str, params: dict, key: str, out: Path, preset: str) -> float:
    """Run notebooks/<stem>.ipynb under papermill into <out>/executed/ (cwd <out>/work); returns the seconds taken.
    What an earlier run of it left under its run_dir / root is removed first (a Trainer refuses to overwrite)."""
    import papermill as pm

    from brorl_lab.lab.sweep import KERNEL, kernel_options

    work = out / "work"
    for name in ("run_dir", "root"):
        target = params.get(name)
        if isinstance(target, str) and target and not Path(target).is_absolute():
            shutil.rmtree(work / target, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    dest = out / "executed" / f"{stem}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # a failed run leaves no stale key behind
    partial = dest.with_suffix(".partial.ipynb")
    t0 = time.monotonic()
    saved = {k: os.environ.get(k) for k in ("IPYTHONDIR", "OMP_NUM_THREADS", "PYTHONPATH")}
    os.environ.update(kernel_env(out))  # the kernel inherits this process's environment
    try:
        pm.execute_notebook(str(NOTEBOOKS / f"{stem}.ipynb"), str(partial), parameters=params, kernel_name=KERNEL,
                            cwd=str(work), progress_bar=False, **kernel_options())
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    seconds = time.monotonic() - t0
    nb = nbformat.read(partial, as_version=4)
    nb.metadata["brorl_book"] = {"key": key, "preset": preset, "parameters": params, "seconds": round(seconds, 1)}
    nbformat.write(nb, dest)
    partial.unlink()
    return seconds


def cached(stem: str, key: str, out: Path) -> bool:
    dest = out / "executed" / f"{stem}.ipynb"
    return dest.is_file() and nbformat.read(dest, as_version=4).metadata.get("brorl_book", {}).get("key") == key


def widget_figures(state: dict, model_id: str) -> list[dict]:
    """The plotly figures inside the widget ``model_id`` as its saved state holds them (``{"data", "layout"}``, in
    the order they sit in the widget): plotly's FigureWidget is an anywidget model whose state keeps the figure it
    shows as ``_widget_data`` / ``_widget_layout``; containers list their children as ``"IPY_MODEL_<id>"``."""
    figures, todo, seen = [], [model_id], set()
    while todo:
        mid = todo.pop(0)
        if mid in seen or mid not in state:
            continue
        seen.add(mid)
        model = with_buffers(state[mid])
        if "_widget_data" in model:  # traces added after the widget was built come in its last addTraces message
            data = model["_widget_data"] or (model.get("_py2js_addTraces") or {}).get("trace_data") or []
            if data:  # a figure with no trace draws nothing: no still for it
                figures.append({"data": data, "layout": model.get("_widget_layout", {})})
        todo += [c[len("IPY_MODEL_"):] for c in model.get("children", []) if str(c).startswith("IPY_MODEL_")]
    return figures


def with_buffers(saved: dict) -> dict:
    """A widget's saved ``state`` with its binary ``buffers`` put back: plotly sends numpy arrays as
    ``{"dtype", "shape"}`` plus a buffer stored apart (base64, at a path into the state); each becomes a list."""
    import base64
    import copy

    import numpy as np

    state = copy.deepcopy(saved.get("state", {}))
    for buf in saved.get("buffers", []):
        *path, last = buf["path"]
        node = state
        try:
            for key in path:
                node = node[key]
            node[last] = base64.b64decode(buf["data"])
        except (KeyError, IndexError, TypeError):  # a buffer of a model field the figure does not use
            continue

    def arrays(x):
        if isinstance(x, dict) and isinstance(x.get("buffer"), bytes) and "dtype" in x:
            return np.frombuffer(x["buffer"], dtype=x["dtype"]).reshape(x.get("shape", -1)).tolist()
        if isinstance(x, dict):
            return {k: arrays(v) for k, v in x.items()}
        if isinstance(x, list):
            return [arrays(v) for v in x]
        return x

    return arrays(state)


def still_figure(fig: dict) -> dict:
    """A display output drawing ``fig`` as a static page does every other figure: plotly's HTML, no plotly.js."""
    import plotly.io as pio

    html = pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False, default_width="100%",
                       default_height=fig.get("layout", {}).get("height") or 450, validate=False)
    return nbformat.v4.new_output("display_data", data={"text/html": html})


def for_the_page(nb, plotlyjs_id: str):
    """The executed notebook as the page shows it: the inert plotly.js copy dropped (the page loads
    _static/plotly.min.js once), each figure's plotly JSON dropped beside its HTML twin, each widget replaced by a
    note followed by still copies of the plotly figures it showed (from the widget state), the widget state dropped
    (myst-nb would load the widget manager from a CDN for it), and a line under the title saying how the notebook
    was run."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for o in cell.outputs:
            data = o.get("data", {})
            if plotlyjs_id in data.get("text/html", "") and f'id="{plotlyjs_id}"' in data["text/html"][:300]:
                continue
            if WIDGET in data:
                figures = widget_figures(state, data[WIDGET].get("model_id", ""))
                o.data = {"text/markdown": WIDGET_NOTE if figures else WIDGET_NOTE_BARE}
                kept += [o, *(still_figure(f) for f in figures)]
                continue
            if PLOTLY in data and "text/html" in data:
                del data[PLOTLY]  # the page draws the HTML twin; myst-nb has no renderer for plotly's JSON
            kept.append(o)
        cell.outputs = kept
    nb.metadata.pop("widgets", None)
    info = nb.metadata["brorl_book"]
    shown = ", ".join(f"`{k}={v!r}`" for k, v in info["parameters"].items()) or "its own defaults"
    note = (f"*Executed by `make book` (preset `{info['preset']}`, {info['seconds']:.0f} s) with {shown}; the "
            "injected-parameters cell below the parameters cell shows the same. Sizes are the book's, not the "
            "papers': the full-size measurements are on the results pages.*")
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(at, nbformat.v4.new_markdown_cell(note))
    return nb


def stage(out: Path, stems: list[str]) -> Path:
    """<out>/src: docs/book's sources, the Markdown pages, the figures they show, the executed notebooks as pages,
    and _static (plotly.js, MathJax). Rebuilt from scratch each time (it is cheap; the executions are the cache)."""
    import jupyter_server_mathjax
    from plotly.offline import get_plotlyjs

    from brorl_lab.lab.plots import PLOTLYJS_ID

    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    (src / "notebooks").mkdir(parents=True)
    for name in SOURCES:
        shutil.copy(BOOK / name, src / name)
    for rel in PAGES:
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, src / rel, dirs_exist_ok=True, ignore=lambda d, names: [
                n for n in names if n in NOT_PAGES and Path(d) == ROOT / rel])
        elif (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, src / rel)
    for stem in stems:
        nb = nbformat.read(out / "executed" / f"{stem}.ipynb", as_version=4)
        nbformat.write(for_the_page(nb, PLOTLYJS_ID), src / "notebooks" / f"{stem}.ipynb")
    static = src / "_static"
    shutil.copytree(BOOK / "_static", static)  # book.css
    (static / "plotly.min.js").write_text(get_plotlyjs())
    shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", static / "mathjax")
    return src


def build(preset: str, out: Path, force: bool = False, log=None, presets: Path = PRESETS) -> Path:
    """Execute what changed, stage, run Sphinx; returns <out>/html/index.html."""
    log = log or functools.partial(print, flush=True)
    presets = load_presets(preset, presets)
    code = code_digest()
    order = sorted(presets, key=lambda s: (reads_runs(presets[s]), s))
    keys: dict[str, str] = {}
    for stem in order:
        params = presets[stem]
        upstream = [keys[s] for s in order if s in keys] if reads_runs(params) else []
        keys[stem] = key = notebook_key(stem, params, preset, code, upstream)
        if not force and cached(stem, key, out):
            log(f"{stem}: cached (notebook, parameters and code unchanged)")
            continue
        log(f"{stem}: executing ({preset} preset) ...")
        log(f"{stem}: {execute(stem, params, key, out, preset):.0f} s")
    src = stage(out, order)
    html = out / "html"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "1", str(src), str(html)], check=True)
    log(f"sphinx: {time.monotonic() - t0:.0f} s -> {html / 'index.html'}")
    return html / "index.html"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="book", help="sizes from docs/book/presets.yml: book (make book) or tiny")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="build folder (default build/book)")
    ap.add_argument("--presets", type=Path, default=PRESETS, help="the presets file (default docs/book/presets.yml)")
    ap.add_argument("--force", action="store_true", help="execute every notebook even where its key is unchanged")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        index = build(args.preset, args.out.resolve(), args.force, presets=args.presets)
    except BookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"book built in {time.monotonic() - t0:.0f} s: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
