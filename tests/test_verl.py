"""launch --to verl and import-run --from verl, checked against verl 0.9.1 itself (no GPU): its packaged Hydra config
composes our overrides to the values meant, its reward loader scores through our reward module, its dataset class
reads our parquet files, and its own logger writes the metrics import-run reads back.

verl is the optional `verl` extra (`make env` installs it with --no-deps: its pins clash with ours); every test that
needs it skips, with that reason, where it cannot be imported.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from brorl_lab.cli import main
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.paths import DEFAULT_MODEL_DIR, REPO_ROOT
from brorl_lab.lab.verl_launch import launch_verl, read_overrides
from brorl_lab.lab.verl_names import VERL_FIELDS, hydra_value, verl_table


@pytest.fixture(scope="module")
def verl():
    return pytest.importorskip("verl", reason="verl 0.9.1 is not installed (the `verl` extra; `make env` installs it)")


def small(**kw) -> Config:
    base = dict(tasks=["spell_backward", "simple_equations"], rollouts_per_prompt=16, prompts_per_step=4, steps=2,
                eval_every=1, eval_prompts=3, eval_k=[1])
    return Config(**{**base, **kw})


@pytest.fixture(scope="module")
def arms():
    from brorl_lab.study.arms import arm_configs
    from brorl_lab.study.recipe import recipe_config

    return arm_configs(recipe_config(steps=2, eval_every=1, eval_prompts=3))


# ---- the name table -----------------------------------------------------------------------------------------------------
def test_every_config_field_has_a_verl_row_and_the_docs_hold_the_table():
    assert set(VERL_FIELDS) == set(Config.field_names())
    page = (REPO_ROOT / "docs" / "ECOSYSTEM.md").read_text()
    assert verl_table() in page, "docs/ECOSYSTEM.md's verl table is stale: paste lab.verl_names.verl_table()"


def test_hydra_values_are_written_in_hydra_grammar():
    assert [hydra_value(v) for v in (None, True, 3, 3e-4, [0.9, 0.999], "a'b")] == \
        ["null", "true", "3", "0.0003", "[0.9,0.999]", "\"a'b\""]
    assert hydra_value("x\\") == "'x\\\\'"  # a backslash right before the closing quote is escaped
    with pytest.raises(ConfigError, match="both quote characters"):
        hydra_value("'\"")


# ---- launch: verl's own config composition --------------------------------------------------------------------------------
@pytest.mark.parametrize("arm", ["prorl", "brorl"])
def test_launch_of_the_flagship_arms_composes_in_verls_config(verl, arms, arm, tmp_path):
    from brorl_lab.lab.verl_compose import check_launch, compose_verl

    cfg = arms[arm]
    res = launch_verl(cfg, tmp_path, train_prompts=4 * cfg.prompts_per_step)
    assert "checked: all" in check_launch(tmp_path)  # every key exists in verl's config and holds what we meant
    got = compose_verl(read_overrides(tmp_path / "overrides.txt"),
                       ["actor_rollout_ref.rollout.n", "data.train_batch_size", "algorithm.adv_estimator",
                        "actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.clip_ratio_high",
                        "algorithm.filter_groups.enable", "algorithm.filter_groups.metric", "trainer.test_freq",
                        "actor_rollout_ref.actor.ppo_mini_batch_size", "data.train_files"],
                       env={"BRORL_VERL_DIR": str(tmp_path)})
    assert got["actor_rollout_ref.rollout.n"] == cfg.rollouts_per_prompt
    assert got["data.train_batch_size"] == cfg.prompts_per_step
    assert got["actor_rollout_ref.actor.ppo_mini_batch_size"] * cfg.optimizer_steps_per_step == cfg.prompts_per_step
    assert got["algorithm.adv_estimator"] == "reinforce_plus_plus_baseline"  # the flagship's ProRL v2 recipe
    assert got["actor_rollout_ref.actor.kl_loss_type"] == "k2" and got["actor_rollout_ref.actor.clip_ratio_high"] == 0.27
    assert got["algorithm.filter_groups.enable"] is True and got["algorithm.filter_groups.metric"] == "acc"
    assert got["data.train_files"] == f"{tmp_path}/train.parquet"
    due = {s for s in range(1, cfg.steps + 1) if cfg.eval_due(s)}
    assert all(s % got["trainer.test_freq"] == 0 or s == cfg.steps for s in due)  # every evaluation we meant happens
    assert any("max_resample_rounds" in w for w in res.warnings)
    assert (tmp_path / "WARNINGS.txt").read_text().splitlines() == res.warnings + res.notes  # notes: what was copied
    # what run_verl.sh hands verl: absolute paths (its trainer is a Ray actor without our shell's environment), and
    # verl's file logger pointed at OUT/logs through Ray's runtime_env; composed with no environment at all
    lines = subprocess.run(["bash", str(tmp_path / "run_verl.sh"), "--dry-run"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    got = compose_verl(lines, ["data.val_files", "reward.custom_reward_function.path",
                               "ray_kwargs.ray_init.runtime_env.env_vars"], env={"BRORL_VERL_DIR": ""})
    assert got["data.val_files"] == f"{tmp_path}/eval.parquet"
    assert got["reward.custom_reward_function.path"] == f"{tmp_path}/reward.py"
    assert got["ray_kwargs.ray_init.runtime_env.env_vars"]["VERL_FILE_LOGGER_PATH"] == f"{tmp_path}/logs/metrics.jsonl"


def test_verls_config_refuses_a_typod_key_and_a_changed_value(verl, tmp_path):
    from brorl_lab.lab.verl_compose import VerlComposeError, check_launch, compose_verl

    with pytest.raises(VerlComposeError, match="actor_rollout_ref.rollout.nn"):
        compose_verl(["actor_rollout_ref.rollout.nn=16"], ["actor_rollout_ref.rollout.n"])
    launch_verl(small(), tmp_path)
    text = (tmp_path / "overrides.txt").read_text()
    (tmp_path / "overrides.txt").write_text(text.replace("actor_rollout_ref.rollout.n=16", "actor_rollout_ref.rollout.n=17"))
    with pytest.raises(VerlComposeError, match=r"actor_rollout_ref.rollout.n: meant 16, verl has 17"):
        check_launch(tmp_path)


def test_knobs_verl_cannot_express_are_named_and_strict_refuses_before_writing(tmp_path):
    cfg = small(reset_every=5, reset_optimizer=True, eval_k=[1, 2], dtype="float32", eval_at_steps=[3], eval_every=2,
                steps=4)
    res = launch_verl(cfg, tmp_path / "a")
    text = "\n".join(res.warnings)
    for knob in ("reset_every=5", "reference and optimizer reset", "eval_k=[1, 2]", "dtype='float32'",
                 "max_resample_rounds=4", "eval_at_steps=[3]"):
        assert knob in text
    assert res.overrides["trainer.test_freq"] == 1  # gcd(2, 3): a grid holding steps 2, 3 and 4
    with pytest.raises(ConfigError, match="launch --strict: .*reset_every=5"):
        launch_verl(cfg, tmp_path / "b", strict=True)
    assert not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="already holds overrides.txt"):
        launch_verl(cfg, tmp_path / "a")


# ---- the reward module through verl's loader; the data through verl's dataset class ---------------------------------------
def _composed(tmp_path, keys):
    from brorl_lab.lab.verl_compose import compose_verl

    return compose_verl(read_overrides(tmp_path / "overrides.txt"), keys, env={"BRORL_VERL_DIR": str(tmp_path)})


def test_reward_module_scores_through_verls_loader(verl, tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    launch_verl(small(reward="correct"), tmp_path)
    fn = get_custom_reward_fn(OmegaConf.create({"reward": _composed(tmp_path, ["reward"])["reward"]}))
    rows = pd.read_parquet(tmp_path / "eval.parquet")
    assert set(rows["data_source"]) == {"spell_backward", "simple_equations"}

    def score(r, text):
        return fn(data_source=r.data_source, solution_str=text, ground_truth=r.reward_model["ground_truth"],
                  extra_info=dict(r.extra_info))

    for r in rows.itertuples():
        right = " " + json.loads(r.extra_info["item"])["answer"]
        assert score(r, right) == {"score": 1.0, "acc": 1.0}
        assert score(r, " zzz") == {"score": 0.0, "acc": 0.0}
    # verl's reward manager calls it in a worker thread (math-verify must work there)
    r = next(rows[rows["data_source"] == "simple_equations"].itertuples())
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(score, r, " " + r.reward_model["ground_truth"]).result()["acc"] == 1.0
    with pytest.raises(ValueError, match="extra_info.item is"):
        fn(data_source="gcd", solution_str="1", ground_truth="1", extra_info=dict(r.extra_info))


@pytest.mark.parametrize("template", ["plain", "chat"])
def test_verls_dataset_reads_the_parquet_files_and_renders_our_prompts(verl, tmp_path, template):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from brorl_lab.rollout.tasks import TASKS, TaskItem

    res = launch_verl(small(template=template), tmp_path)
    got = _composed(tmp_path, ["data", "actor_rollout_ref.model.custom_chat_template"])
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    tok.chat_template = got["actor_rollout_ref.model.custom_chat_template"]  # as verl's HFModelConfig does
    data = OmegaConf.create({**got["data"], "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1})
    for split, n in (("train", res.train_rows), ("eval", sum(res.eval_rows.values()))):
        ds = RLHFDataset(data_files=[got["data"][f"{'train' if split == 'train' else 'val'}_files"]], tokenizer=tok,
                         config=data)
        assert len(ds) == n  # none dropped as too long: max_prompt_length was measured on them
        for i in (0, n - 1):
            row = ds[i]
            item = TaskItem(**json.loads(row["extra_info"]["item"]))
            rendered = tok.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=False)
            assert rendered == TASKS.get(item.family).format_prompt(item, template)  # verl's prompt is ours
            assert row["data_source"] == item.family and row["extra_info"]["split"] == split


def test_train_and_eval_rows_keep_our_partition(tmp_path):
    from brorl_lab.rollout.tasks import eval_set

    launch_verl(small(), tmp_path)
    train = pd.read_parquet(tmp_path / "train.parquet")
    ev = pd.read_parquet(tmp_path / "eval.parquet")
    uids = lambda df: {e["uid"] for e in df["extra_info"]}  # noqa: E731
    assert not uids(train) & uids(ev)
    assert uids(ev) == {i.uid for f in ("spell_backward", "simple_equations") for i in eval_set(f, limit=3)}
    assert all(":train:" in u for u in uids(train))


# ---- import-run: metrics written by verl's own logger ---------------------------------------------------------------------
def _log_like_verl(path, families, P, steps=3):
    """A metrics jsonl written by verl's Tracking('file') with the names its v1 trainer logs."""
    import os

    from verl.utils.tracking import Tracking

    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        t = Tracking(project_name="brorl_lab", experiment_name="t", default_backend=["file", "console"])

        def val(p):
            return {**{f"val-core/{f}/acc/mean@8": p + 0.01 * i for i, f in enumerate(families)},
                    **{f"val-aux/{f}/score/mean@8": p for f in families}}

        t.log(val(0.30), step=0)  # val_before_train
        for s in range(1, steps + 1):
            m = {"critic/score/mean": 0.3 + 0.05 * s, "critic/rewards/mean": 0.3 + 0.05 * s, "actor/kl_loss": 1e-3 * s,
                 "actor/entropy": 0.5, "actor/grad_norm": 1.2, "actor/lr": 3e-4, "actor/pg_loss": -0.01,
                 "response_length/mean": 3.5, "response_length/max": 8.0, "response_length/clip_ratio": 0.0,
                 "timing_s/step": 10.0 + s, "timing_s/gen": 5.0, "perf/throughput": 1000.0,
                 "training/filter_groups/evicted_samples": 2 * s, "training/global_step": s, "training/epoch": 0}
            if s == steps:
                m.update(val(0.35), **{"timing_s/testing": 2.0})
            t.log(m, step=s)
        t.finish()
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]


def test_import_run_reads_verls_file_logger_and_report_draws_it(verl, tmp_path, capsys):
    from brorl_lab.lab.tracking import run_index

    out = tmp_path / "launch"
    assert main(["launch", "--to", "verl", str(_yaml(tmp_path, small(prompts_per_step=4, steps=3))), str(out)]) == 0
    (out / "logs").mkdir()
    _log_like_verl(out / "logs" / "metrics.jsonl", ["spell_backward", "simple_equations"], P=4)
    run = tmp_path / "runs" / "from_verl"
    assert main(["import-run", "--from", "verl", str(out), str(run)]) == 0
    m = pd.read_parquet(run / "metrics.parquet")
    assert list(m["step"]) == [0, 1, 2, 3]
    # kept / generated groups: P / (P + evicted), evicted = 2, 4, 6 groups
    assert m["ds_pass_rate"].iloc[1:].tolist() == pytest.approx([4 / 6, 4 / 8, 4 / 10])
    assert m["cum_samples"].iloc[-1] == (6 + 8 + 10) * 16
    assert m["cum_wall_s"].iloc[-1] == pytest.approx(11 + 12 + 13 - 2.0)  # evaluation time excluded
    assert m["eval/mean/pass@1"].dropna().tolist() == pytest.approx([0.305, 0.355])
    assert m["kl"].iloc[-1] == pytest.approx(3e-3) and m["reward_mean"].iloc[-1] == pytest.approx(0.45)
    assert "perf/throughput" in pd.read_parquet(run / "verl_metrics.parquet")
    # the console logger's lines (what `tee` keeps in logs/console.log) import to the same metrics
    console = out / "logs" / "console.log"
    console.write_text(capsys.readouterr().out)
    assert main(["import-run", "--from", "verl", str(console), str(tmp_path / "runs" / "from_console"),
                 "--config", str(out / "brorl_config.yaml")]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "runs" / "from_console" / "metrics.parquet"), m)
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    for panel in ("mean reward", "dynamic-sampling pass rate", "KL to reference", "spell_backward pass@1 (eval)",
                  "mean pass@1 (eval)"):
        assert f'"text":"{panel}"' in html.replace(": ", ":"), panel
    idx = run_index(tmp_path / "runs").set_index("run")  # what the run browser lists
    assert idx.loc["from_verl", "status"] == "finished" and idx.loc["from_verl", "source"] == "verl"


def test_import_run_refuses_what_it_cannot_read(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"step": 1, "data": {"a": 1}}\nnot json {\n')
    with pytest.raises(ConfigError, match="no brorl_config.yaml"):
        from brorl_lab.lab.verl_import import import_verl_run

        import_verl_run(tmp_path, tmp_path / "run")
    cfg = _yaml(tmp_path, small())
    (tmp_path / "bad.jsonl").write_text('{"steps": 1}\n')
    with pytest.raises(ValueError, match=re.escape("line 1 is not a verl file-logger record")):
        import_verl_run(tmp_path / "bad.jsonl", tmp_path / "run", config=cfg)
    assert not (tmp_path / "run").exists()


def _yaml(tmp_path, cfg: Config):
    import yaml

    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg.to_dict()))
    return p


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["launch", "--to", "verl", str(tmp_path / "missing.yaml"), str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "CONFIG_OR_RUN" in err
    with pytest.raises(SystemExit):
        main(["import-run", "--from", "verl", str(tmp_path / "nolog"), str(tmp_path / "run")])
    assert "LOGDIR" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


# ---- a launch folder travels: moved elsewhere, its reward module scores its own rows --------------------------------
def test_a_moved_launch_folder_scores_its_rows_and_names_no_path_of_this_machine(tmp_path, capsys):
    """A local task file and a local model: both are copied into the folder, which is then moved (the laptop's
    originals deleted); the reward module, imported from the new place by path as verl does, scores every parquet
    row of both splits (right answer 1, wrong 0). Nothing in overrides.txt names the old place, and `--check`'s
    portability part finds nothing; an absolute data path it does find."""
    import importlib.util
    import shutil

    from brorl_lab.lab.verl_launch import portability_problems

    laptop = tmp_path / "laptop"
    laptop.mkdir()
    rows = [{"question": f"State the final answer to the following arithmetic problem: {x} + {y} =",
             "answer": str(x + y)} for x in range(1, 10) for y in range(1, 10)]
    qa = laptop / "qa.jsonl"
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = shutil.copytree(DEFAULT_MODEL_DIR, laptop / "model")
    res = launch_verl(Config(tasks=[f"local:{qa}"], model=str(model), rollouts_per_prompt=4, prompts_per_step=2,
                             steps=2, eval_prompts=3, eval_k=[1], reward="correct"), laptop / "out")
    assert any("copied into model/" in n for n in res.notes) and "data/qa.jsonl" in (laptop / "out" / "WARNINGS.txt").read_text()
    cluster = shutil.move(str(laptop / "out"), str(tmp_path / "cluster" / "launch"))
    shutil.rmtree(laptop)  # the laptop's model and task file are gone
    text = (tmp_path / "cluster" / "launch" / "overrides.txt").read_text()
    assert [ln for ln in text.splitlines() if str(tmp_path) in ln] == []
    assert "actor_rollout_ref.model.path='${oc.env:BRORL_VERL_DIR}/model'" in text
    assert portability_problems(cluster) == []

    spec = importlib.util.spec_from_file_location("moved_reward", f"{cluster}/reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    scored = 0
    for split in ("train", "eval"):
        for r in pd.read_parquet(f"{cluster}/{split}.parquet").itertuples():
            info = dict(r.extra_info)
            assert info["task_file"] == "data/qa.jsonl"
            kw = dict(data_source=r.data_source, ground_truth=r.reward_model["ground_truth"], extra_info=info)
            assert reward.compute_score(solution_str=" " + r.reward_model["ground_truth"], **kw) == {"score": 1.0,
                                                                                                      "acc": 1.0}
            assert reward.compute_score(solution_str=" 1000", **kw)["acc"] == 0.0
            scored += 1
    assert scored >= 4 + 3

    overrides = f"{cluster}/overrides.txt"
    with open(overrides, "a") as f:
        f.write("data.train_files=/cluster/x/train.parquet\n")
    assert any("absolute path (/cluster/x/train.parquet)" in p for p in portability_problems(cluster))
