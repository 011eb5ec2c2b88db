"""The book (`make book`, docs/book/build_book.py): built small, offline, then read in a real browser.

The build test runs the same command as `make book` with ``--preset tiny`` (every notebook executed under papermill
at seconds-sized parameters, then Sphinx + myst-nb) into a tmp folder, once per module: executing the notebooks at
the book's own sizes would take tens of minutes, and what is tested here (every notebook runs and is rendered with
its outputs, text progress bars, figures drawn from the bundled plotly.js, links, no network) does not depend on the
sizes. Headless Chromium then opens every page the build links, from disk, with every request that is not file://
refused and recorded: each page loads without a script error, draws every plotly figure its notebook made, shows
every image, typesets its maths (MathJax from the build), every link inside the book resolves (file and #anchor), and
no request left the folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import nbformat
import pytest
from helpers_notebooks import BUILDER, book_builder
from test_browser import CHROMIUM, chromium, wait_for  # noqa: F401 - chromium: the shared browser fixture

REPO = Path(__file__).resolve().parents[1]
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
TEXT_BAR = re.compile(r"100%\|[^\n]*\| *(\d+)/\1 ")  # tqdm's text bar at its end, e.g. "100%|####| 30/30 [..."


builder = book_builder


def test_every_notebook_has_a_preset_of_each_size_its_parameters_cell_declares():
    book = builder()
    for preset in ("book", "tiny"):
        presets = book.load_presets(preset)  # raises on a missing notebook or an undeclared parameter
        assert set(presets) == {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}


def test_a_bad_preset_is_one_line_naming_it_and_exit_2(tmp_path, capsys):
    import yaml

    book = builder()
    presets = yaml.safe_load(book.PRESETS.read_text())
    presets["tiny"]["01_mass_balance_theory"]["vocabulary"] = 10  # the notebook's parameter is `vocab`
    bad = tmp_path / "presets.yml"
    bad.write_text(yaml.safe_dump(presets))
    out = tmp_path / "book"
    for argv, needle in ((["--preset", "tiny", "--presets", str(bad)], "'vocabulary'"),
                         (["--preset", "huge"], "allowed: book, tiny")):
        assert book.main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()  # nothing executed, nothing written


MD_LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)


def test_every_relative_link_of_a_book_page_points_at_a_file_the_book_stages():
    """A fast twin of the crawl below: a Markdown page's relative link must land on a file the book copies (a page,
    a figure, a notebook); Sphinx turns a link to anything else (a bench JSON, a .py) into a dangling #fragment."""
    book = builder()
    staged = {REPO / rel for rel in book.PAGES} | {REPO / "notebooks"}
    pages = [REPO / "README.md", *(p for p in (REPO / "docs").rglob("*.md")
                                   if not p.is_relative_to(REPO / "docs" / "book"))]
    bad = []
    for page in pages:
        for target in MD_LINK.findall(page.read_text()):
            if urlparse(target).scheme or target.startswith(("#", "mailto:")):
                continue
            file = (page.parent / unquote(urldefrag(target)[0])).resolve()
            inside = any(file == s or file.is_relative_to(s) for s in staged)
            if not (file.exists() and inside) or (file.parent == REPO / "notebooks" and file.suffix != ".ipynb"):
                bad.append(f"{page.relative_to(REPO)} -> {target}")
    assert not bad, bad


@pytest.fixture(scope="module")
def tiny_book(tiny_book_out):
    """`make book` at the tiny preset: (build folder, seconds it took). The folder is the session's
    (tests/conftest.py's ``tiny_book_out``: the notebook tests of this unit executed theirs into it already, and the
    builder's cache skips those), or $BRORL_BOOK_TEST_OUT: a folder kept between runs, where every notebook whose key
    has not changed is skipped (a rerun then costs the Sphinx build, about 20 s)."""
    out = tiny_book_out
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(BUILDER), "--preset", "tiny", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    return out, time.monotonic() - t0


def outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


@pytest.mark.notebook
@pytest.mark.slow
def test_the_tiny_book_executes_every_notebook_with_text_bars_and_caches_it(tiny_book):
    out, seconds = tiny_book
    executed = {p.stem: nbformat.read(p, as_version=4) for p in (out / "executed").glob("*.ipynb")}
    assert set(executed) == {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
    bars = {}
    for stem, nb in executed.items():
        outs = outputs(nb)
        assert not [o for o in outs if o.output_type == "error"], stem
        # no tqdm widget (it would be frozen at "0%" in a static page): tqdm.auto fell back to text
        assert not [o for o in outs if WIDGET in o.get("data", {}) and "%|" in o.data.get("text/plain", "")], stem
        stderr = "".join(o.text for o in outs if o.output_type == "stream" and o.name == "stderr")
        bars[stem] = len(TEXT_BAR.findall(stderr))
    assert sum(bars.values()) >= 3, bars  # 01's sweeps, 02's and 05's training runs print bars
    # the staged page: the widget state and the inert 4.8 MB plotly.js copy are gone, plotly.js is loaded once
    page = nbformat.read(out / "src" / "notebooks" / "01_mass_balance_theory.ipynb", as_version=4)
    assert "widgets" not in page.metadata and not any('id="brorl-lab-plotly-js"' in o.get("data", {}).get("text/html", "")
                                                     for o in outputs(page))
    assert all(WIDGET not in o.get("data", {}) for o in outputs(page))
    # every widget's note is followed, in its cell, by a still of the plots it showed (01c's explorer, built empty
    # and filled by lab.widgets.replace_figure, included): no page says that its widget's plots could not be kept
    stills: dict[str, list[bool]] = {}
    for staged in (out / "src" / "notebooks").glob("*.ipynb"):
        for cell in (c for c in nbformat.read(staged, as_version=4).cells if c.cell_type == "code"):
            shown = [o.get("data", {}).get("text/markdown", "") + o.get("data", {}).get("text/html", "")
                     for o in cell.outputs]
            stills.setdefault(staged.stem, []).extend(
                text == builder().WIDGET_NOTE and "plotly-graph-div" in "".join(shown[i + 1:i + 2])
                for i, text in enumerate(shown) if "An interactive widget" in text)
    assert {"01_mass_balance_theory", "01b_theorem_on_the_model", "01c_allocation"} <= {
        stem for stem, found in stills.items() if found}, stills
    assert all(all(found) for found in stills.values()), stills
    # a second build with nothing changed executes nothing (the keys match) and only re-renders
    again = subprocess.run([sys.executable, str(BUILDER), "--preset", "tiny", "--out", str(out)], cwd=REPO,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": cached") == len(executed) and "executing" not in again.stdout
    print(f"tiny book: {seconds:.0f} s to build, bars per notebook {bars}")


def local_target(url: str) -> tuple[Path, str] | None:
    """(file, fragment) of a link inside the book, None for a link elsewhere (which must not exist)."""
    base, fragment = urldefrag(url)
    parsed = urlparse(base)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    return (path / "index.html" if path.is_dir() else path), fragment


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)),
                    reason=f"no Chromium executable at {CHROMIUM} (set BRORL_CHROMIUM to one)")
def test_every_page_loads_offline_draws_its_figures_and_its_links_resolve(tiny_book, chromium):  # noqa: F811, C901 - one crawl
    out, _ = tiny_book
    html = out / "html"
    # the figures each page must draw: its notebook's plotly outputs, plus the still copies of its widgets' plots
    figures = {p.stem: sum("plotly-graph-div" in o.get("data", {}).get("text/html", "")
                           for o in outputs(nbformat.read(p, as_version=4)))
               for p in (out / "src" / "notebooks").glob("*.ipynb")}
    todo, seen, links, remote, report = [html / "search.html", html / "index.html"], set(), [], [], {}
    anchors: dict[Path, set[str]] = {}  # page -> its element ids
    wanted: dict[Path, set[str]] = {}  # page -> the #fragments links point to
    page = chromium.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith(("file:", "data:", "blob:")):
            return r.continue_()
        remote.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    try:
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            page.goto(path.as_uri(), timeout=90_000)
            page.wait_for_load_state("load")
            plots = page.locator(".js-plotly-plot")
            drawn = plots.filter(has=page.locator(".main-svg .trace"))
            wait_for(lambda: drawn.count() == plots.count(), f"every plot of {path.name} to be drawn")
            if path.parent.name == "notebooks":
                assert drawn.count() == figures[path.stem], f"{path.name}: {drawn.count()} of {figures[path.stem]}"
            if page.locator(".math").count():  # MathJax (local) typeset the page's maths
                wait_for(lambda: page.locator(".MathJax, .MathJax_Display").count(), f"MathJax on {path.name}")
            page.locator("img").evaluate_all("els => els.forEach(e => e.loading = 'eager')")
            broken = lambda: page.locator("img").evaluate_all(  # noqa: E731 - polled below
                "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).map(e => e.src)")
            wait_for(lambda: not broken(), f"the images of {path.name} to load ({broken()[:3]})")
            report[path.relative_to(html).as_posix()] = drawn.count()
            hrefs = page.locator("a[href]").evaluate_all("els => els.map(e => e.href)")
            anchors[path] = set(page.locator("[id]").evaluate_all("els => els.map(e => e.id)"))
            for href in hrefs:
                target = local_target(href)
                if target is None:
                    continue  # an http(s) link a reader may follow; no page loads anything from it (checked below)
                file, fragment = target
                links.append((path.name, href))
                assert file.is_file(), f"{path.name} links to {href}, which does not exist"
                if fragment and file.suffix == ".html":
                    wanted.setdefault(file, set()).add(fragment)
                if file.suffix == ".html" and file.is_relative_to(html) and file not in seen:
                    todo.append(file)
    finally:
        page.close()
    assert not errors, errors
    for file, fragments in wanted.items():  # every linked page was opened: its ids are known
        missing = fragments - anchors[file]
        assert not missing, f"links to {file.relative_to(html)}#{sorted(missing)[0]}, which it does not hold"
    assert not remote, f"requests that left file://: {remote[:5]}"
    stems = {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
    assert {f"notebooks/{s}.html" for s in stems} | {"docs/THEORY.html"} <= set(report), sorted(report)
    assert sum(report.values()) == sum(figures.values()) > 0
    print(json.dumps({"pages": len(report), "links": len(links), "plots": report}, indent=1))


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)),
                    reason=f"no Chromium executable at {CHROMIUM} (set BRORL_CHROMIUM to one)")
def test_notebook_pages_render_tables_fit_their_figures_and_picture_every_widget(tiny_book, chromium):  # noqa: F811
    """What a student reading the book sees: Markdown a cell printed is rendered (no raw `| --- |` table row, no raw
    `$...$`), every plotly figure fits its column at 1280 px and at a phone's 400 px, every widget's note is followed
    by still figures of its default view, and an exercise check that ran the solution says so."""
    out, _ = tiny_book
    html = out / "html" / "notebooks"
    notes = {}
    for width in (1280, 400):
        page = chromium.new_page(viewport={"width": width, "height": 900})
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:", "blob:"))
                   else r.abort())
        try:
            for path in sorted(html.glob("*.html")):
                page.goto(path.as_uri(), timeout=90_000)
                page.wait_for_load_state("load")
                plots = page.locator(".js-plotly-plot")
                wait_for(lambda: plots.filter(has=page.locator(".main-svg .trace")).count() == plots.count(),
                         f"every plot of {path.name} to be drawn")
                shown = page.locator(".cell_output").evaluate_all("els => els.map(e => e.innerText)")  # not code
                raw = [o[:60] for o in shown if "| --- |" in o or "|---|" in o or "---:|" in o or "$Q_{" in o]
                assert not raw, f"{path.name}: Markdown printed by a cell shows raw: {raw[:2]}"
                text = page.locator("article").inner_text()
                too_wide = lambda: plots.evaluate_all(  # noqa: E731 - the width plotly drew at (its div is 100%
                    "els => els.map(e => [e._fullLayout.width, e.parentElement.clientWidth])"  # wide whatever it drew)
                    ".filter(([w, c]) => w > c + 2)")
                # book.js fits the figures on load and again 0.3 s and 1.5 s later: polled until they fit (a page
                # whose figures never fit fails here after 10 s), not a fixed wait of 2 s per page and width
                deadline = time.monotonic() + 10
                while (wide := too_wide()) and time.monotonic() < deadline:
                    page.wait_for_timeout(250)
                assert not wide, f"{path.name} at {width} px: figures wider than their column {wide[:3]}"
                if width == 1280:
                    notes[path.stem] = page.evaluate(
                        """() => [...document.querySelectorAll('.cell_output')].map(o => [
                               o.innerText.includes('An interactive widget is drawn here')
                               && !o.innerText.includes('its plots could not be kept'),
                               o.querySelectorAll('.js-plotly-plot').length])""")
                    if "this run used the reference solution" not in text:
                        assert "def " not in text or "@exercise" not in text, f"{path.name}: an exercise ran " \
                            "without saying whose function passed"
        finally:
            page.close()
    widget_pages = {stem: cells for stem, cells in notes.items() if any(note for note, _ in cells)}
    assert {"01_mass_balance_theory", "01b_theorem_on_the_model", "01c_allocation"} <= set(widget_pages), \
        sorted(widget_pages)
    for stem, cells in widget_pages.items():  # the note and the still figures sit in the same cell's output
        assert all(figures >= 1 for note, figures in cells if note), f"{stem}: a widget without a picture"
