"""Real browser: JupyterLab on 127.0.0.1 and headless Chromium (Playwright).

1. The theory notebook runs through "Run All Cells"; moving the mass-balance explorer's N slider must change the
   rendered plot (title text and bar shapes read from the page's SVG).
2. A small notebook trains a tiny model with the live TrainingDashboard; the curves must grow in the page, and a
   click on its Stop button must stop the run after the current step (status.json says "interrupted").
3. Pages opened from disk with every network request refused (offline): a `report` page draws every plot it
   embeds (the HTML `python -m brorl_lab demo` writes is opened the same way by tests/test_notebooks_flagship.py,
   beside the demo run it reads).

The server's root is a tmp directory: a copy of notebooks/01_mass_balance_theory.ipynb with small sizes injected
the way papermill injects parameters (a cell after the "parameters" cell), and the dashboard notebook; the runs it
trains go there too. Nothing is written into the repository except screenshots under runs/browser/ (git-ignored).
Skips only when no Chromium executable exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from helpers_notebooks import tiny_preset, write_notebook
from helpers_runs import make_tiny_runs

from brorl_lab.lab.widgets import DASHBOARD_STOP_LABEL, EXPLORER_N_DESCRIPTION, EXPLORER_TITLE

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "01_mass_balance_theory.ipynb"
SHOTS = REPO / "runs" / "browser"
CHROMIUM = os.environ.get("BRORL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
# Small enough that Run All finishes in seconds on two shared cores: the tiny book's size, as test_theory_notebook.
SMALL = tiny_preset(NOTEBOOK.stem)
HIST_TITLE = "Monte-Carlo draws of ΔQ_pos at"
BAR_PATHS = ".trace.bars .point path"  # one SVG path per bar (error bars are separate paths)
DASHBOARD_NB = "live_dashboard.ipynb"
# notebook 01's plots: first order, Lemma 2, 2 N-sweeps, Fig. 3 twice, budget, and the explorer's three
NOTEBOOK_01_PLOTS = 10
DASHBOARD_STEPS = 100_000  # hours of training: only the Stop button can end it within the test

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)),
                       reason=f"no Chromium executable at {CHROMIUM} (set BRORL_CHROMIUM to one)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


def small_theory_notebook(dest: Path) -> Path:
    """notebooks/01 with SMALL in a cell after its parameters cell, as papermill injects parameters."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "\n".join(f"{k} = {v!r}" for k, v in SMALL.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    out = dest / NOTEBOOK.name
    nbformat.write(nb, out)
    return out


def dashboard_notebook(dest: Path) -> Path:
    """A notebook that trains a tiny model in the background with the live dashboard (as notebook 03 does)."""
    return write_notebook(
        dest / DASHBOARD_NB, f"steps = {DASHBOARD_STEPS}",
        "import transformers\n"
        "from brorl_lab.core.config import Config\n"
        "from brorl_lab.rl.trainer import Trainer\n"
        "from brorl_lab.lab.widgets import TrainingDashboard\n"
        "transformers.logging.disable_progress_bar()",
        "cfg = Config(tasks=['gcd'], rollouts_per_prompt=8, prompts_per_step=4, max_new_tokens=8, steps=steps,\n"
        "             eval_every=0, checkpoint_every=0, max_resample_rounds=1, lr=3e-3, kl_beta=0.01,\n"
        "             reset_every=2, torch_threads=1, run_dir='runs', run_name='live')\n"
        "trainer = Trainer(cfg, progress=False)\n"
        "dash = TrainingDashboard(metrics=('reward_mean', 'entropy', 'kl'))\n"
        "display(dash)\n"
        "job = dash.start(trainer)")


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A real JupyterLab server on 127.0.0.1 (free port, token, no browser) over a tmp root holding the test
    notebooks; always shut down, with every kernel it started."""
    tmp_path = tmp_path_factory.mktemp("jupyterlab")
    root, home = tmp_path / "root", tmp_path / "jupyter"
    root.mkdir()
    small_theory_notebook(root)
    dashboard_notebook(root)
    settings = home / "settings" / "@jupyterlab"
    for ext, name, values in (
            # every cell attached to the DOM (the default windowing leaves off-screen widgets unrendered), and the
            # notebook's kernel started without the "Select Kernel" dialog
            ("notebook-extension", "tracker", {"windowingMode": "none", "autoStartDefaultKernel": True}),
            ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False})):
        (settings / ext).mkdir(parents=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    port, token = free_port(), f"brorl-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                api(base, token, "/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield {"base": base, "token": token, "root": root}
    finally:
        try:
            for k in api(base, token, "/api/kernels"):
                api(base, token, f"/api/kernels/{k['id']}", method="DELETE")
        except OSError:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started (its own session)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def notebook_page(chromium, server: dict, name: str, width: int = 1900):
    """Open notebook ``name`` in a fresh page, wait for its kernel, run it with the Run > Run All Cells menu
    command (ARCHITECTURE.md: not Shift+Enter right after load). On failure, a full-page screenshot and the page's
    HTML go to runs/browser/failure-<name>.*; afterwards the notebook's kernel is shut down."""
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": width, "height": 1000})
    try:
        # ?reset: a fresh workspace, so the notebook of an earlier test is not restored next to this one
        page.goto(f"{server['base']}/lab/tree/{name}?reset&token={server['token']}", timeout=90_000)
        expect(page.locator(".jp-Notebook")).to_be_visible(timeout=90_000)
        deadline = time.monotonic() + 90
        while not any(s["path"] == name and s.get("kernel") for s in api(server["base"], server["token"],
                                                                            "/api/sessions")):
            assert time.monotonic() < deadline, f"the kernel of {name} never started"
            time.sleep(0.5)
        expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=90_000)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        yield page
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                              has_text="Traceback")
        assert errors.count() == 0, errors.first.text_content()
    except BaseException:
        stem = f"failure-{Path(name).stem}"
        page.screenshot(path=str(SHOTS / f"{stem}.png"), full_page=True)
        (SHOTS / f"{stem}.html").write_text(page.content())
        raise
    finally:
        page.close()
        for session in api(server["base"], server["token"], "/api/sessions"):  # stop this notebook's kernel
            if session["path"] == name:
                api(server["base"], server["token"], f"/api/sessions/{session['id']}", method="DELETE")


def shoot(element, tmp_path: Path, name: str) -> Path:
    """Screenshot ``element`` into the test's tmp_path and runs/browser/."""
    out = tmp_path / name
    element.screenshot(path=str(out))
    shutil.copy(out, SHOTS / name)
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, f"{name} is not a real screenshot"
    return out


def bar_shapes(plot) -> list[str]:
    """The SVG outline ("d") of each bar of a rendered plotly bar chart."""
    return plot.locator(BAR_PATHS).evaluate_all("els => els.map(e => e.getAttribute('d'))")


def wait_for(predicate, what: str, timeout: float = 30.0):
    """Poll ``predicate()`` until it is truthy (plotly renders a kernel's update asynchronously); returns it."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.25)
    return value


def written_into_repo() -> list[Path]:
    """What a server rooted in the repo would have left: checkpoints, the test notebook, its runs."""
    return [p for p in (REPO / "notebooks" / ".ipynb_checkpoints", REPO / "notebooks" / DASHBOARD_NB,
                        REPO / "notebooks" / "runs", REPO / "runs" / "live") if p.exists()]


def test_moving_the_n_slider_redraws_the_explorer(jupyterlab, chromium, tmp_path):
    from playwright.sync_api import expect

    assert not jupyterlab["root"].resolve().is_relative_to(REPO)
    before = written_into_repo()
    with notebook_page(chromium, jupyterlab, NOTEBOOK.name) as page:
        slider = page.locator(".widget-hslider").filter(
            has=page.locator(".widget-label", has_text=re.compile(f"^{re.escape(EXPLORER_N_DESCRIPTION)}$")))
        expect(slider).to_have_count(1, timeout=120_000)
        slider.scroll_into_view_if_needed()
        explorer = slider.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')][1]")
        terms = explorer.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text=EXPLORER_TITLE))
        hist = explorer.locator(".gtitle", has_text=HIST_TITLE)
        expect(terms).to_have_count(1, timeout=60_000)
        expect(terms.locator(BAR_PATHS)).to_have_count(4, timeout=60_000)
        readout = slider.locator(".widget-readout")
        expect(readout).to_have_text("512")
        bars_before, hist_before = bar_shapes(terms), hist.text_content()
        shoot(explorer, tmp_path, "explorer_before.png")

        handle = slider.locator(".noUi-handle")
        handle.focus()
        for _ in range(3):  # 512 -> 1,024 -> 2,048 -> 4,096 on the log2 grid
            handle.press("ArrowRight")
        expect(readout).to_have_text("4,096")
        expect(hist).to_have_text(re.compile(r"N = 4,096"), timeout=30_000)  # the kernel redrew the figure
        bars_after = wait_for(lambda: (b := bar_shapes(terms)) != bars_before and b, "the bars to be redrawn")
        shoot(explorer, tmp_path, "explorer_after.png")
        # every figure drawn, once: a static figure (mimetype + HTML twin for exports) is not drawn twice
        drawn = page.locator(".js-plotly-plot").filter(has=page.locator(".main-svg .trace"))
        expect(drawn).to_have_count(NOTEBOOK_01_PLOTS, timeout=60_000)
    assert "N = 4,096" not in hist_before
    assert bars_after != bars_before and len(bars_after) == 4
    assert written_into_repo() == before == []


def test_live_dashboard_grows_and_its_stop_button_stops_the_run(jupyterlab, chromium, tmp_path):
    from playwright.sync_api import expect

    run_dir = jupyterlab["root"] / "runs" / "live"
    with notebook_page(chromium, jupyterlab, DASHBOARD_NB) as page:
        button = page.locator("button", has_text=DASHBOARD_STOP_LABEL)
        expect(button).to_be_enabled(timeout=120_000)  # enabled once the trainer is attached
        dash = page.locator(".jp-OutputArea-output").filter(has=page.locator(".js-plotly-plot"))
        expect(dash).to_have_count(1)
        reward = dash.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text="mean reward"))
        # the cell returned at once (training runs in a thread), and the curve grows in the page step by step
        status = dash.locator(".widget-html-content", has_text=re.compile(r"step ([4-9]|\d\d+) /"))
        expect(status).to_have_count(1, timeout=120_000)
        line, marks = reward.locator(".scatterlayer .trace").nth(0), reward.locator(".scatterlayer .trace").nth(1)
        wait_for(lambda: line.locator(".points path").count() >= 4, "4 points of the reward curve")
        wait_for(lambda: marks.locator(".points path").count() >= 1, "a reset marker")  # reset_every=2: red ×
        shoot(dash, tmp_path, "dashboard_running.png")
        clicked_at = int(re.search(r"step (\d+) /", status.text_content())[1])
        button.click()
        t_click = time.monotonic()
        wait_for(lambda: json.loads((run_dir / "status.json").read_text())["status"] != "running",
                 "the run to stop after the click", timeout=60)
        stop_s = time.monotonic() - t_click
        stopped = dash.locator(".widget-html-content", has_text="stopped (resumable")
        expect(stopped).to_have_count(1, timeout=30_000)
        shoot(dash, tmp_path, "dashboard_stopped.png")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and clicked_at <= status["step"] < DASHBOARD_STEPS
    print(f"Stop clicked at step {clicked_at} (as shown), run stopped at step {status['step']} {stop_s:.1f} s later")
    assert (run_dir / "checkpoint" / "state.pt").exists()  # resumable
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1] == "interrupted" and "reset" in events


# ---- 3. exported pages, offline --------------------------------------------------------------------------------------


def rendered_plots(chromium, page_path: Path, shot: str) -> int:
    """Open ``page_path`` from disk with every non-file request refused; returns how many plotly plots the page
    drew (a ``.js-plotly-plot`` with its SVG and at least one trace). Page errors fail the test."""
    page = chromium.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    try:
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
        page.goto(page_path.resolve().as_uri(), timeout=90_000)
        page.wait_for_load_state("load")
        drawn = page.locator(".js-plotly-plot").filter(has=page.locator(".main-svg .trace"))
        wait_for(lambda: drawn.count() == page.locator(".js-plotly-plot").count(), "every plot to be drawn")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / shot), full_page=True)
        assert not errors, errors
        return drawn.count()
    finally:
        page.close()


def test_a_report_page_draws_its_plots_offline(chromium, tmp_path):
    from brorl_lab.lab.report import write_report

    runs = make_tiny_runs(tmp_path / "runs")
    page = write_report([runs["n4"].parent])
    assert rendered_plots(chromium, page, "report.png") == 3  # training curves, held-out pass@1, pass@k
