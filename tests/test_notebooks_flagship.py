"""Runs notebooks/00_quickstart.ipynb and notebooks/02_rollout_scaling.ipynb headless under papermill, tiny sizes."""

import json
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from helpers_notebooks import NOTEBOOKS, assert_notebook_pair_in_sync, exercise_names

from brorl_lab.study import compare as C
from brorl_lab.study import revival as R

papermill = pytest.importorskip("papermill")

PLOTLY = "application/vnd.plotly.v1+json"
QUICK = dict(prompts_per_step=4, rollouts_per_prompt=8, trainer_steps=2, seed=0, torch_threads=1, use_solutions=True)
SCALING = dict(steps=2, eval_every=1, seeds=[0, 1], n_small=4, n_large=16, prompts_small=2, prompts_large=2,
               n_mid=8, prompts_mid=2, middle_seeds=[0], optimizer_steps_per_step=1, eval_prompts=8, eval_samples=4,
               eval_k=[1, 4], torch_threads=1, run_ablations=True, ablation_prompts=[1, 2], ablation_seeds=[0],
               mechanism_prompts=8, mechanism_draws=16)


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
    assert "your advantages match rl.algo.grpo on" in printed(outputs)  # the exercise, with its solution filled in
    metrics = pd.read_parquet(tmp_path / "run" / "quickstart" / "metrics.parquet")
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


def test_rollout_scaling_notebook_is_a_study_on_a_shared_grid_with_intervals_and_the_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from brorl_lab.cli import main

    run_dir = tmp_path / "demo"  # through `python -m brorl_lab scaling`: the notebook headless, its verdict printed
    argv = ["scaling", "--out", str(run_dir), "--steps", "2", "--eval-every", "1", "--seeds", "0", "1",
            "--middle-seeds", "0", "--n-small", "4", "--n-large", "16", "--prompts-small", "2", "--prompts-large", "2",
            "--n-mid", "8", "--prompts-mid", "2", "--eval-prompts", "8", "--eval-samples", "4", "--run-ablations"]
    argv += [x for k, v in SCALING.items() if k not in {a.lstrip("-").replace("-", "_") for a in argv}
             for x in ("-p", f"{k}={v!r}")]
    assert main(argv) == 0
    nb = nbformat.read(run_dir / "02_rollout_scaling.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o.data[PLOTLY] for o in outputs if o.output_type in ("display_data", "execute_result")
               and PLOTLY in o.data]
    # pass@1 vs samples, vs updates, vs time, diagnostics, grid gaps, mechanism, ablations
    assert len(figures) == 7
    names = {t.get("name") for f in figures for t in f["data"]}
    assert {"ProRL (N=4)", "BroRL (N=16)", "Middle (N=8)"} <= names
    assert any(str(n).endswith("seed range") for n in names)  # two seeds: the band is drawn
    assert {"BroRL (N=16) - ProRL (N=4)", "Middle (N=8) - ProRL (N=4)"} <= names  # the paired gaps with intervals
    assert "P(group of N=4 informative)" in names and "P(group of N=16 informative)" in names
    text = printed(outputs)
    assert "The rule, fixed before the run" in text and R.REVIVES_RULE in text
    assert "Does BroRL revive the plateau?" in text and "MDE" in text and "pass@4 at equal samples" in text
    assert text.count("Does BroRL revive the plateau?") == 1 and "Verdict (" not in text  # one verdict, the rule's
    colors = {t.get("name"): t.get("line", {}).get("color") for t in figures[0]["data"]}
    assert colors["ProRL (N=4)"] == C.ARM_COLORS["prorl"] and colors["BroRL (N=16)"] == C.ARM_COLORS["brorl"]
    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert set(df["arm"]) == {"prorl", "brorl", "middle"} and set(df["seed"]) == {0, 1}
    assert df.groupby("arm")["step"].max().to_dict() == {"brorl": 2, "middle": 4, "prorl": 8}
    assert set(df.loc[df["arm"] == "middle", "seed"]) == {0}
    # the shared grid: every BroRL-arm budget (samples and updates) is a measured point of both other arms
    ev = df[df["eval/mean/pass@1"].notna()]
    for x in R.GRID_AXES:
        bro = set(ev.loc[ev["arm"] == "brorl", x])
        assert len(bro) == 3 and all(bro <= set(ev.loc[(ev["arm"] == a) & (ev["seed"] == 0), x])
                                     for a in ("prorl", "middle"))
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["seeds"] == 2 and set(verdict["conditions"]) == {
        "prorl_stalled", "brorl_rising", "ahead_at_equal_samples", "gain_on_rare_side"}
    assert verdict["revives"] == all(c["met"] for c in verdict["conditions"].values())
    assert verdict["gap_at_equal_samples"]["t"] == pytest.approx(12.706, abs=1e-3)  # t_{0.975, 1}
    assert set(verdict["pass_at_k_at_equal_samples"]) == {"1", "4"}
    mech = verdict["mechanism"]  # condition 4: one paired difference per seed (none when the class is empty)
    assert set(mech["per_seed"]) == {"0", "1"} and mech["n"] == (2 if mech["prompts"] else 0)
    assert (run_dir / "verdict.txt").read_text().startswith("Does BroRL revive the plateau?")
    grid = pd.read_csv(run_dir / "grid_samples.csv")
    assert list(grid["budget"]) == [0, 32, 64] and (grid["n"] == 2).all()
    abl = pd.read_csv(run_dir / "ablations.csv", index_col="variant")
    assert list(abl.index) == ["main", "prompts_large=1", "lr_scaling=sqrt_samples, prompts_large=1",
                               "lr_scaling=sqrt_samples", "advantage=grpo"]
    prompts = pd.read_csv(run_dir / "mechanism_prompts.csv")
    assert len(prompts) == 8 and {"p", "reach", "p after ProRL (N=4) s1", "p after BroRL (N=16) s0"} <= set(prompts)
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    if shutil.which("chromium") or Path("/usr/bin/chromium").exists():
        assert pngs == ["ablations.png", "diagnostics.png", "grid_gaps.png", "mechanism.png",
                        "pass_at_1_vs_samples.png", "pass_at_1_vs_time.png", "pass_at_1_vs_updates.png"]
    else:
        assert "PNG export skipped" in text
