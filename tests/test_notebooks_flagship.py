"""Runs notebooks/00_quickstart.ipynb and notebooks/02_rollout_scaling.ipynb headless under papermill, tiny sizes."""

import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from brorl_lab.study import experiments as E

from helpers_notebooks import NOTEBOOKS, assert_notebook_pair_in_sync

papermill = pytest.importorskip("papermill")

PLOTLY = "application/vnd.plotly.v1+json"
QUICK = dict(prompts_per_step=4, rollouts_per_prompt=8, trainer_steps=2, seed=0, torch_threads=1)
SCALING = dict(steps=2, eval_every=2, seeds=[0, 1], n_small=4, n_large=16, prompts_small=4, prompts_large=2,
               optimizer_steps_per_step=1, eval_prompts=8, eval_samples=2, torch_threads=1, ablation_prompts=[2, 4],
               ablation_seeds=[0], mechanism_prompts=4, mechanism_draws=16)


@pytest.mark.parametrize("name, params", [("00_quickstart", QUICK), ("02_rollout_scaling", SCALING)])
def test_notebook_pair_is_in_sync_with_outputs_cleared(name, params):
    assert_notebook_pair_in_sync(name, params)


def test_the_pair_check_fails_when_only_the_text_file_was_edited(tmp_path):
    import shutil

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


def test_quickstart_shows_every_stage_and_a_trainer_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    outputs = run("00_quickstart", tmp_path, {**QUICK, "run_dir": str(tmp_path / "run")})
    html = shown(outputs, "text/html")
    text = shown(outputs)
    assert "RolloutBatch(prompts=4, n=8, samples=32" in html and "<table" in html  # the batch's HTML table
    assert "FilterStats(generated_groups=" in text
    assert "UpdateReport(loss=" in text and "grad_norm=" in text
    assert "engine weights equal the updated policy: True" in printed(outputs)
    metrics = pd.read_parquet(tmp_path / "run" / "quickstart" / "metrics.parquet")
    assert list(metrics["step"]) == [0, 1, 2] and metrics["eval/mean/pass@1"].notna().sum() == 2
    figures = [o.data[PLOTLY] for o in outputs if PLOTLY in o.get("data", {})]  # it ends with a picture
    assert len(figures) == 1 and {a["text"] for a in figures[0]["layout"]["annotations"]} == {
        "mean reward", "train pass@1", "mean pass@1 (eval)"}
    assert {len([y for y in t["y"] if y is not None]) for t in figures[0]["data"] if t["name"] == "quickstart"} == {2}


def test_rollout_scaling_notebook_is_a_study_with_bands_ablations_and_mechanism(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_dir = tmp_path / "demo"
    outputs = run("02_rollout_scaling", tmp_path, {**SCALING, "run_dir": str(run_dir), "export_png": True})
    figures = [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
               and PLOTLY in o.data]
    assert len(figures) == 6  # pass@1 vs samples, vs updates, vs time, diagnostics, ablations, mechanism
    names = {t.get("name") for f in figures for t in f["data"]}
    assert {"ProRL (N=4)", "BroRL (N=16)"} <= names
    assert any(str(n).endswith("seed range") for n in names)  # two seeds: the band is drawn
    assert {"equal samples generated", "equal optimizer updates"} <= names  # the ablation bars per budget
    assert "P(group of N=4 informative)" in names and "P(group of N=16 informative)" in names
    html = shown(outputs, "text/html")
    assert "final pass@1 mean" in html  # the summary table
    text = printed(outputs)
    assert "Verdict (BroRL (N=16) vs ProRL (N=4)" in text and "At equal generated samples" in text
    assert "At equal optimizer updates" in text
    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert set(df["arm"]) == {"prorl", "brorl"} and set(df["seed"]) == {0, 1}
    assert df.groupby("arm")["step"].max().to_dict() == {"brorl": 2, "prorl": 4}
    verdict_part, findings_part = (run_dir / "verdict.txt").read_text().strip().split("\n\n- ", 1)
    assert verdict_part in text and findings_part in text  # the verdict, then the study's computed reading
    assert "Best BroRL setting at equal samples" in findings_part and "reached only by the large N" in findings_part
    abl = pd.read_csv(run_dir / "ablations.csv", index_col="variant")
    assert list(abl.index) == ["main", "prompts_large=4", "lr_scaling=sqrt_samples",
                               "lr_scaling=sqrt_samples, prompts_large=4", "advantage=grpo"]
    assert abl.loc["main", "seeds"] == 2 and abl.loc["prompts_large=4", "seeds"] == 1
    # main's row is the main comparison: the same budget and gap as compare_arms on the main runs
    main = E.compare_arms(df, "cum_samples").set_index("family").loc["mean"]
    assert abl.loc["main", "samples: budget"] == pytest.approx(main["budget"])
    assert abl.loc["main", "samples: gap (points)"] == pytest.approx(100 * main["gap"])
    reach = pd.read_csv(run_dir / "mechanism_reach.csv", index_col=0)
    assert reach.iloc[-1]["family"] == "all" and reach.iloc[-1]["prompts"] == 4
    change = pd.read_csv(run_dir / "mechanism_change.csv", index_col=0)
    assert set(change["arm"]) == {"ProRL (N=4)", "BroRL (N=16)"}
    prompts = pd.read_csv(run_dir / "mechanism_prompts.csv")
    assert len(prompts) == 4 and {"p", "reach", "p after ProRL (N=4)", "p after BroRL (N=16)"} <= set(prompts)
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    if shutil.which("chromium") or Path("/usr/bin/chromium").exists():
        assert pngs == ["ablations.png", "diagnostics.png", "mechanism.png", "pass_at_1_vs_samples.png",
                        "pass_at_1_vs_time.png", "pass_at_1_vs_updates.png"]
    else:
        assert "PNG export skipped" in text
