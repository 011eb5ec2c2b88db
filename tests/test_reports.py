"""Results people can look at (issue 19): notebook exports that keep their figures, a report page per run or set of
runs, and sweeps whose output is not buried under kernel warnings.

Real components throughout: papermill runs real kernels, nbconvert writes the HTML, the Trainer trains the shipped
tiny model for a step or two. What a browser draws from these pages is checked in tests/test_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import plotly.io as pio
import pytest
from helpers_notebooks import write_notebook
from helpers_runs import make_tiny_runs

from brorl_lab import cli
from brorl_lab.lab import plots, report, sweep, tracking

REPO = Path(__file__).resolve().parents[1]
PLOTLY = "application/vnd.plotly.v1+json"
PLOTLYJS_BANNER = "* plotly.js v"  # the licence banner at the top of the embedded bundle: one per embedded copy
TCP_WARNING = "running over TCP without encryption"
TINY_TRAIN = ["--tasks", "gcd", "--rollouts-per-prompt", "4", "--prompts-per-step", "2", "--max-new-tokens", "8",
              "--eval-every", "1", "--eval-prompts", "4", "--eval-samples", "2", "--eval-k", "1", "2",
              "--checkpoint-every", "0", "--max-resample-rounds", "1", "--torch-threads", "1", "--quiet"]
FIGURES_CELLS = (
    "from IPython.display import display\nfrom brorl_lab.lab import plots",
    "plots.empty_figure('nothing to plot yet', title='first figure')",  # a cell's value
    "display(plots.empty_figure('still nothing', title='second figure'))\nprint('printed after')",  # display()
)


def figures_notebook(path: Path) -> Path:
    """A notebook that imports lab.plots (as every shipped notebook does) and draws two figures."""
    return write_notebook(path, "x = 1", *FIGURES_CELLS)


def plotly_outputs(nb_path: Path) -> list:
    nb = nbformat.read(nb_path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type in ("display_data", "execute_result") and PLOTLY in o.data]


# ---- 1. notebook exports keep their figures --------------------------------------------------------------------------
def test_outside_a_kernel_the_renderer_is_left_alone():
    assert pio.renderers.default != plots.EXPORTABLE_RENDERER
    assert plots.exportable_figures() is False and plots.exportable_figures(force=True) is False


def test_an_executed_notebook_carries_each_figure_as_offline_html_and_nbconvert_keeps_it(tmp_path, capfd):
    nb = figures_notebook(tmp_path / "figures.ipynb")
    status = sweep.run_notebook(nb, tmp_path / "run")
    assert status["status"] == "finished", status
    outputs = plotly_outputs(tmp_path / "run" / "figures.ipynb")
    assert len(outputs) == 2 and all("text/html" in o.data for o in outputs)  # JupyterLab's mimetype + an HTML twin
    assert all("Plotly.newPlot" in o.data["text/html"] and "https://" not in o.data["text/html"] for o in outputs)
    page = Path(status["html"]).read_text()
    assert page.count(PLOTLYJS_BANNER) == 1, "plotly.js embedded once per page"
    assert page.count("Plotly.newPlot(") == 2 and "first figure" in page and "second figure" in page
    assert page.index(PLOTLYJS_BANNER) < page.index("Plotly.newPlot(")  # defined before the first figure needs it
    assert TCP_WARNING not in capfd.readouterr().err


def test_a_renderer_chosen_by_the_user_is_kept(tmp_path, monkeypatch):
    """PLOTLY_RENDERER (or a notebook's own choice) wins: the helper only upgrades plotly's plain-kernel default."""
    monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype")
    nb = figures_notebook(tmp_path / "figures.ipynb")
    assert sweep.run_notebook(nb, tmp_path / "run", html=False)["status"] == "finished"
    outputs = plotly_outputs(tmp_path / "run" / "figures.ipynb")
    assert len(outputs) == 2 and not any("text/html" in o.data for o in outputs)


# ---- 4. quiet runs ---------------------------------------------------------------------------------------------------
def test_a_sweep_prints_no_transport_warning_but_real_errors_still_show(tmp_path, capfd):
    if not sweep.kernel_options():
        pytest.skip("pyzmq without CurveZMQ or jupyter_client < 8.10: kernels start unencrypted and say so")
    import papermill as pm

    nb = write_notebook(tmp_path / "noisy.ipynb", "fail = False",
                        "import sys\nprint('a real problem on the kernel stderr', file=sys.__stderr__, flush=True)",
                        "if fail:\n    raise RuntimeError('this run failed for real')")
    # the control: the warning is real, and papermill's defaults print it
    pm.execute_notebook(str(nb), str(tmp_path / "control.ipynb"), kernel_name="python3", progress_bar=False)
    assert TCP_WARNING in capfd.readouterr().err
    index = sweep.run_sweep(nb, {"fail": [False, True]}, out=tmp_path / "sweep", progress=False)
    err = capfd.readouterr().err
    assert TCP_WARNING not in err
    assert err.count("a real problem on the kernel stderr") == 2  # what a kernel writes to stderr still shows
    assert list(index["status"]) == ["finished", "failed"]
    assert "RuntimeError: this run failed for real" in index["error"].iloc[1]
    page = (tmp_path / "sweep" / report.REPORT_FILE).read_text()  # the sweep's report: its index, no training runs
    assert "Sweep index" in page and "this run failed for real" in page and "no training runs" in page


# ---- 2. a report for every run ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict:
    """Two finished two-step runs that differ in N, and a run directory with only a config (helpers_runs)."""
    return make_tiny_runs(tmp_path_factory.mktemp("runs"))


def figures_in(page: str) -> list[dict]:
    """The plotly figures of a report page: (data, layout) read back from each Plotly.newPlot call."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        data, end = dec.raw_decode(page, m.end())
        layout, _ = dec.raw_decode(page, page.index("{", end))
        out.append({"data": data, "layout": layout})
    return out


def panel_titles(fig: dict) -> set[str]:
    return {a["text"] for a in fig["layout"].get("annotations", [])}


def test_report_of_one_run_has_config_training_curves_and_pass_at_k(tiny_runs):
    path = report.write_report([tiny_runs["n4"]])
    assert path == tiny_runs["n4"] / report.REPORT_FILE
    page = path.read_text()
    js = path.parent / report.PLOTLYJS_FILE  # plotly.js once beside the page, not inside it
    assert f'<script src="{js.name}"></script>' in page and PLOTLYJS_BANNER not in page and "https://" not in page
    assert js.read_text().count(PLOTLYJS_BANNER) == 1 and len(page.encode()) < 1_000_000  # issue 46: under 1 MB
    again = report.write_report([tiny_runs["n4"]], path.parent / "again.html")  # a second page shares the file
    assert sorted(p.name for p in path.parent.glob("*.js")) == [js.name] and again.stat().st_size < 1_000_000
    assert PLOTLYJS_BANNER in report.report_html([tiny_runs["n4"]])  # a page as a string (no folder) embeds it
    for heading in ("Runs", "Config", "Training curves", "Held-out evaluation"):
        assert f"<h2>{heading}</h2>" in page
    assert "<td>rollouts_per_prompt</td>" in page and "<td>finished</td>" in page
    training, held_out, pass_k = figures_in(page)
    assert {"mean reward", "dynamic-sampling pass rate", "KL to reference", "entropy (nats/token)",
            "clipped share (upper)", "mean response length", "generation samples/s"} <= panel_titles(training)
    assert {"mean pass@1 (eval)", "gcd pass@1 (eval)"} <= panel_titles(held_out)
    assert {t["name"] for t in pass_k["data"]} >= {"n4", "n4 · gain"}
    assert re.search(r"<td>n4</td>\s*<td>4</td>", page)  # the pass@k table has its k = 4 row


def test_report_over_several_runs_overlays_them_labelled_by_what_differs(tiny_runs, tmp_path):
    root = tiny_runs["n4"].parent
    assert sorted(report.collect_runs([root])) == ["n4", "n8"]  # the config-only directory is no run
    page = report.write_report([root], tmp_path / "both.html").read_text()
    training = figures_in(page)[0]
    reward = {t["name"] for t in training["data"] if t.get("xaxis", "x") == "x" and "·" not in t["name"]}
    assert reward == {"rollouts_per_prompt=4, reset_every=1", "rollouts_per_prompt=8, reset_every=0"}
    assert "settings shared by all runs" in page


def test_train_writes_a_report_at_the_end(tmp_path, capsys):
    assert cli.main(["train", "--steps", "1", "--run-dir", str(tmp_path), "--run-name", "one", *TINY_TRAIN]) == 0
    assert f"report: {tmp_path / 'one' / report.REPORT_FILE}" in capsys.readouterr().out
    assert len(figures_in((tmp_path / "one" / report.REPORT_FILE).read_text())) == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_train_stopped_by_a_signal_checkpoints_reports_and_exits_128_plus_it(tmp_path, sig):
    """Ctrl-C, and SIGTERM (how Slurm and Kubernetes preempt): finish the step, checkpoint, mark the run
    interrupted, write the report, and exit 128 + the signal's number (130, 143) so a job system sees the stop.
    The SIGTERM run is a batch job as Slurm runs it (no --quiet, stderr a file): plain step lines, no carriage
    returns, no third-party bars, and the same lines in <run>/train.log."""
    batch = sig == signal.SIGTERM
    cmd = [sys.executable, "-m", "brorl_lab", "train", "--steps", "100000", "--run-dir", str(tmp_path / "runs"),
           "--run-name", "stopped", *[a for a in TINY_TRAIN if not (batch and a == "--quiet")]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    metrics = tmp_path / "runs" / "stopped" / "metrics.parquet"
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 180
            while not (metrics.is_file() and len(tracking.RunDir(metrics.parent).read_metrics()) >= 2):
                assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-2000:]
                assert time.monotonic() < deadline, "no training step within 180 s"
                time.sleep(0.2)
            proc.send_signal(sig)  # one signal: finish the step, checkpoint, return
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 128 + sig, (tmp_path / "err.txt").read_text()[-2000:]
    assert tracking.RunDir(metrics.parent).read_status()["status"] == "interrupted"
    assert (metrics.parent / "checkpoint" / "state.pt").is_file()
    assert "train --resume" in (tmp_path / "err.txt").read_text()
    page = (metrics.parent / report.REPORT_FILE).read_text()
    assert "report: " in (tmp_path / "out.txt").read_text()
    assert "<td>interrupted</td>" in page and len(figures_in(page)) == 3
    log = (metrics.parent / "train.log").read_text()
    assert "step 1/100000" in log and "interrupted at step" in log, log
    if batch:
        text = (tmp_path / "err.txt").read_bytes().decode()  # not read_text(): it turns carriage returns into \n
        assert "step 1/100000" in text and "\r" not in text, text[-2000:]
        assert not re.search(r"Loading weights|checkpoint shards|Timeout", text, re.I), text[-2000:]


@pytest.mark.parametrize("argv, needle", [
    (["report", "{root}/no_such_run"], "runs: "),
    (["report", "{root}/partial"], "holds no training run"),
    (["report", "{root}/n4", "{root}/n8"], "out: needed"),
    (["report", "{root}/n4", "--out", "{root}/report.txt"], "out: got"),
    (["report", "{root}/n4", "--x", "tokens"], "x: got 'tokens'; allowed: step, cum_samples"),
])
def test_report_bad_input_is_one_line_naming_the_field_and_writes_nothing(argv, needle, tiny_runs, capsys):
    root = tiny_runs["n4"].parent
    before = sorted(root.rglob("*"))
    with pytest.raises(SystemExit) as e:
        cli.main([a.format(root=root) for a in argv])
    err = "".join(ln for ln in capsys.readouterr().err.splitlines(keepends=True) if not ln.startswith("note:"))
    assert e.value.code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(root.rglob("*")) == before


def test_report_api_rejects_a_bare_string_for_the_runs(tiny_runs):
    with pytest.raises(ValueError, match="runs: got .*a list of one or more"):
        report.report_html(str(tiny_runs["n4"]))
