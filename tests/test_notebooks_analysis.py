"""Notebooks 03 (ProRL stabilisers) and 04 (sweep analysis): committed = generated, and they run headless under
papermill with tiny parameters (03 trains its five arms for two steps; 04 reads tiny runs, a partial and an empty
runs root)."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import numpy as np
import pytest
from helpers_notebooks import assert_notebook_pair_in_sync, executed_in_book, tiny_preset
from helpers_runs import make_tiny_runs, run_names

from brorl_lab.lab import tracking

papermill = pytest.importorskip("papermill")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NB03 = NOTEBOOKS / "03_prorl_stabilisers.ipynb"
NB04 = NOTEBOOKS / "04_sweep_analysis.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
TINY03 = tiny_preset(NB03.stem)  # the tiny book's size; reset_kl_threshold left at 0: scaled to the baseline's KL
ARMS = ("baseline", "no KL", "reset every K", "reset on KL", "symmetric clip")


@pytest.mark.parametrize("notebook, params", [(NB03, ["steps", "N", "prompts", "seeds", "run_dir", "torch_threads",
                                                       "live"]),
                                              (NB04, ["runs_root", "metric", "family", "arm_fields", "points"])])
def test_notebook_pair_is_in_sync_with_outputs_cleared(notebook, params):
    assert_notebook_pair_in_sync(notebook.stem, params)


def execute(notebook: Path, out: Path, params: dict, monkeypatch) -> list:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel is a child process; keep it to one core
    papermill.execute_notebook(str(notebook), str(out), parameters=params, kernel_name="python3",
                               cwd=str(out.parent), progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs


def figures(outputs: list) -> list[dict]:
    return [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
            and PLOTLY in o.data]


def arr(v) -> list:
    """A trace array from plotly JSON: a list, or plotly 6+'s typed array {"dtype": "f8", "bdata": base64}."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v or [])


def titled(figs: list[dict], text: str) -> dict:
    return next(f for f in figs if text in str(f["layout"].get("title", {}).get("text", "")))


def test_03_trains_every_arm_and_draws_the_ablations(tiny_book_out):
    """The run the tiny book shows (executed once per session: helpers_notebooks.executed_in_book)."""
    book = executed_in_book(tiny_book_out, NB03.stem)
    outputs, run_dir = book["outputs"], book["work"] / TINY03["run_dir"]
    figs = figures(outputs)
    assert len(figs) == 3
    displayed = {k for o in outputs if o.output_type == "display_data" for k in o.data}
    assert WIDGET not in displayed  # headless (live=False): no dashboard
    for fig in figs:  # every panel has a line for each arm it compares
        assert all(arr(tr.get("x")) for tr in fig["data"] if "resets" not in tr["name"])
    kl = {tr["name"] for tr in titled(figs, "KL penalty")["data"]}
    assert kl == {"baseline", "no KL"}
    resets = titled(figs, "Reference resets")["data"]
    assert {tr["name"] for tr in resets} >= {"baseline", "reset every K", "reset every K · resets"}
    marks = [tr for tr in resets if tr["name"] == "reset every K · resets"]
    assert len(marks) == 4 and all(arr(tr["x"]) == [1, 2] for tr in marks)  # reset_every=1: × at both steps, 4 panels
    assert {tr["name"] for tr in titled(figs, "Clip-higher")["data"]} == {"baseline", "symmetric clip"}
    # every arm really trained, into its own run directory under run_dir (not into the repo)
    dirs = run_names(run_dir)
    assert dirs == sorted(f"{a.replace(' ', '_')}-seed0" for a in ARMS)
    assert all((run_dir / d / "metrics.parquet").exists() for d in dirs)
    summary = next(o for o in outputs if o.output_type == "execute_result" and "late entropy" in o.data["text/plain"])
    assert all(a in summary.data["text/plain"] for a in ARMS)
    assert "updates" in summary.data["text/plain"] and "first step differing" in summary.data["text/plain"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    # the reset-on-KL threshold is 2 x the baseline's median step KL, read back from the baseline's metrics
    baseline_kl = tracking.load_runs(run_dir).query("run == 'baseline-seed0'")["kl"].dropna()
    assert f"reset-on-KL threshold per seed: {{0: {float(f'{2 * baseline_kl.median():.3g}')}}}" in text
    assert "the model: default, 917,120 parameters" in text  # read from the model, not typed
    assert "symmetric clip: " in text and "reset every K: " in text and "no KL: first differs" in text
    assert text.count("distinct answers (start:") == len(ARMS)  # every arm's final policy probed
    assert "0.27" in "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)  # v2's clip, from code


def test_04_compares_tiny_runs_and_handles_a_partial_root(tmp_path, monkeypatch):
    root = tmp_path / "runs04"
    make_tiny_runs(root)  # n4 (N=4, resets), n8 (N=8), and "partial" with a config but no metrics
    outputs = execute(NB04, tmp_path / "04_out.ipynb", {"runs_root": str(root)}, monkeypatch)
    figs = figures(outputs)
    assert len(figs) == 4
    arms = {"rollouts_per_prompt=4, reset_every=1", "rollouts_per_prompt=8, reset_every=0"}
    iso_samples = titled(figs, "equal samples generated")
    names = {tr["name"] for tr in iso_samples["data"]}
    assert names == {f"{a} (1 run)" for a in arms}
    reached = tracking.load_runs(root).groupby("run")["cum_samples"].max()
    assert reached["n8"] > reached["n4"]
    # the common range: from 0 to where the run that generated fewer samples stopped
    assert all(min(arr(tr["x"])) == 0 and max(arr(tr["x"])) == reached["n4"] for tr in iso_samples["data"])
    assert {tr["name"] for tr in titled(figs, "equal training time")["data"]} == names
    pak = titled(figs, "pass@k")
    assert {tr["name"] for tr in pak["data"] if tr.get("showlegend") is not False} == arms
    assert all(arr(tr["x"]) == [1, 2, 4] for tr in pak["data"])
    text = "".join(o.data.get("text/plain", "") for o in outputs if o.output_type == "execute_result")
    assert "partial" in text  # the index lists the run that never logged a step
    assert "reading" in text  # the boundary summary table


def test_04_on_an_empty_root_says_so(tmp_path, monkeypatch):
    outputs = execute(NB04, tmp_path / "04_empty.ipynb", {"runs_root": str(tmp_path / "no_runs")}, monkeypatch)
    markdown = " ".join(o.data.get("text/markdown", "") for o in outputs if o.output_type in ("display_data",
                                                                                             "execute_result"))
    assert "No runs with metrics under" in markdown
    figs = figures(outputs)
    assert len(figs) == 4 and all(f["layout"]["annotations"][0]["text"].startswith("no ") for f in figs)
