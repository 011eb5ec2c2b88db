"""Runs notebooks/00_quickstart.ipynb and notebooks/02_rollout_scaling.ipynb headless under papermill, tiny sizes."""

import os
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from helpers_notebooks import NOTEBOOKS, assert_notebook_pair_in_sync, executed_in_book, exercise_names, tiny_preset
from test_browser import CHROMIUM, chromium, rendered_plots  # noqa: F401 - chromium: the shared browser fixture

papermill = pytest.importorskip("papermill")

PLOTLY = "application/vnd.plotly.v1+json"
QUICK = tiny_preset("00_quickstart")  # the tiny book's size (docs/book/presets.yml), its run in runs/quickstart
#: notebook 02 (the flagship through study.runner) at a test size: the shipped branch points, arms shrunk through the
#: arm table, a budget of 64 generated samples, 2 paired seeds
FLAGSHIP = dict(seeds=[0, 1], budget=64, points=2, eval_prompts=4, eval_samples=2, jobs=1, torch_threads=1,
                arm_table={"prorl": dict(rollouts_per_prompt=2, prompts_per_step=4),
                           "brorl": dict(rollouts_per_prompt=8, prompts_per_step=2)})


@pytest.mark.parametrize("name, params", [("00_quickstart", QUICK), ("02_rollout_scaling", FLAGSHIP)])
def test_notebook_pair_is_in_sync_with_outputs_cleared(name, params):
    assert_notebook_pair_in_sync(name, params)


def test_the_pair_check_fails_when_only_the_text_file_was_edited(tmp_path):

    for suffix in (".ipynb", ".py"):
        shutil.copy(NOTEBOOKS / f"00_quickstart{suffix}", tmp_path / f"00_quickstart{suffix}")
    assert_notebook_pair_in_sync("00_quickstart", QUICK, notebooks=tmp_path)
    with open(tmp_path / "00_quickstart.py", "a") as f:
        f.write("\n# %%\nprint('edited in an editor, not synced')\n")
    with pytest.raises(AssertionError, match="jupytext --sync"):
        assert_notebook_pair_in_sync("00_quickstart", QUICK, notebooks=tmp_path)


def run(name: str, out_dir: Path, params: dict) -> list:
    out = out_dir / f"{name}_out.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out), parameters=params, kernel_name="python3",
                               cwd=str(NOTEBOOKS), progress_bar=False)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs


def shown(outputs: list, mime: str = "text/plain") -> str:
    return "\n".join(str(o.data.get(mime, "")) for o in outputs if o.output_type in ("display_data", "execute_result"))


def printed(outputs: list) -> str:
    return "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def test_quickstart_shows_every_stage_and_a_trainer_run(tiny_book_out):
    """The run the tiny book shows (executed once per session: helpers_notebooks.executed_in_book)."""
    book = executed_in_book(tiny_book_out, "00_quickstart")
    outputs = book["outputs"]
    html = shown(outputs, "text/html")
    text = shown(outputs)
    assert "RolloutBatch(prompts=4, n=8, samples=32" in html and "<table" in html  # the batch's HTML table
    assert "FilterStats(generated_groups=" in text
    assert "UpdateReport(loss=" in text and "grad_norm=" in text
    assert "engine weights equal the updated policy: True" in printed(outputs)
    assert "your advantages match rl.algo.grpo on" in printed(outputs)  # the exercise, with its solution filled in
    metrics = pd.read_parquet(book["work"] / QUICK["run_dir"] / "quickstart" / "metrics.parquet")
    assert list(metrics["step"]) == [0, 1, 2] and metrics["eval/mean/pass@1"].notna().sum() == 2
    figures = [o.data[PLOTLY] for o in outputs if PLOTLY in o.get("data", {})]  # it ends with a picture
    assert len(figures) == 1 and {a["text"] for a in figures[0]["layout"]["annotations"]} == {
        "mean reward", "train pass@1", "mean pass@1 (eval)"}
    assert {len([y for y in t["y"] if y is not None]) for t in figures[0]["data"] if t["name"] == "quickstart"} == {2}


def test_quickstart_stub_fails_its_check(tmp_path, monkeypatch):
    """As a student first runs it (use_solutions=False): the GRPO stub returns zeros and its check stops the
    notebook with a "not yet" message, before anything is trained."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert exercise_names(NOTEBOOKS / "00_quickstart.ipynb") == ["grpo_advantage"]
    with pytest.raises(papermill.PapermillExecutionError) as err:
        run("00_quickstart", tmp_path, {**QUICK, "use_solutions": False, "run_dir": str(tmp_path / "run")})
    assert err.value.ename == "AssertionError" and "not yet" in err.value.evalue
    assert not (tmp_path / "run" / "quickstart").exists()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`make demo` in small (`python -m brorl_lab demo`: notebook 02 under papermill, the flagship through
    study.runner at a test size), once for the tests below: (out folder, its executed notebook's outputs)."""
    from brorl_lab.cli import main
    from brorl_lab.study import runner

    mp = pytest.MonkeyPatch()
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv(runner.HEARTBEAT_ENV, "1")  # the kernel's plain progress line: every second here
    out = tmp_path_factory.mktemp("demo")
    try:
        assert main(["demo", "--out", str(out), *(f"--param={k}={v!r}" for k, v in FLAGSHIP.items())]) == 0
    finally:
        mp.undo()
    nb = nbformat.read(out / "02_rollout_scaling.ipynb", as_version=4)
    return out, [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_the_flagship_notebook_runs_the_study_through_the_runner_and_the_demo_cli_and_paid_read_agree(demo, capsys):
    """The demo: both branch points run, a progress line comes while the arms run, the figures show live and
    shipped seeds, and the closing line holds the reading that the runner and the CLI's `paid --read` give of the
    same files (one reading, by behaviour: the demo, the notebook and the CLI agree)."""
    from brorl_lab.cli import main
    from brorl_lab.study import runner

    out, outputs = demo
    assert not [o for o in outputs if o.output_type == "error"]
    text = printed(outputs)
    figures = [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
               and PLOTLY in o.data]
    assert len(figures) == 5  # per branch point: pass@1 vs generated samples, the gaps; then live beside shipped
    dots = {t["name"]: t for t in figures[-1]["data"]}
    assert set(dots) == {"live: one seed", "shipped: one seed"}
    assert len(dots["live: one seed"]["text"]) == 2 * 2 and len(dots["shipped: one seed"]["text"]) == 20 + 10
    closing = [line for line in text.splitlines() if line.startswith("Reading (study.paid.headline_reading")]
    assert len(closing) == 1
    assert "learned_miniature: " in text and " arm runs finished" in text  # progress while the arms ran
    for name in ("learned", "takeoff"):
        live = out / name / "points.csv"
        assert (out / name / "declaration.json").is_file() and (out / name / "verdict.txt").is_file()
        assert runner.headline_line(live) in closing[0]
        assert runner.headline_line(runner.shipped_points(name)) in closing[0]
        capsys.readouterr()
        assert main(["paid", "--read", str(live)]) == 0  # the CLI's reading of the demo's file: the same line
        assert capsys.readouterr().out.strip() == runner.headline_line(live)
        assert runner.reading_of_points(live) in runner.headline_line(live)
    assert "-0.63 [-1.09, -0.17] points at 131,072 generated samples, 20 paired seeds: BroRL behind" in closing[0]


@pytest.mark.browser
@pytest.mark.skipif(not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)),
                    reason=f"no Chromium executable at {CHROMIUM} (set BRORL_CHROMIUM to one)")
def test_the_demo_html_shows_every_figure_offline(demo, chromium):  # noqa: F811 - the shared browser fixture
    """The demo's nbconvert HTML, opened from disk in headless Chromium with every non-file request refused: it
    draws every plotly figure the executed notebook holds."""
    out, outputs = demo
    figures = sum(PLOTLY in o.get("data", {}) for o in outputs)
    assert figures >= 3
    assert rendered_plots(chromium, out / "02_rollout_scaling.html", "demo_html.png") == figures
