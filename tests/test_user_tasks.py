"""Tasks a user names: any reasoning-gym dataset (``rg:<dataset>``) with its config, and a local question/answer
file (``local:<file>``) scored by math-verify. Real reasoning-gym generators, real math-verify, real files written
here, the real shipped default model for the training run; eval sets go to a cache dir made per test."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from brorl_lab import cli
from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.paths import DATA_DIR
from brorl_lab.rl.spec import resolve
from brorl_lab.rollout.tasks import TASKS, build_tasks, eval_path, eval_set, sample_items
from brorl_lab.rollout.tasks.gym import split_of
from brorl_lab.rollout.tasks.user import USER_EVAL_SIZE, held_out

RG = "rg:basic_arithmetic"  # a reasoning-gym dataset the package never names
EASY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"], "allow_parentheses": False,
        "allow_negation": False}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BRORL_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_sums(path: Path, n: int = 81, *, q: str = "question", a: str = "answer", fmt=str) -> Path:
    """A question/answer file of one-digit sums in the wording the default model knows (chain_sum's)."""
    rows = [{q: f"State the final answer to the following arithmetic problem: {x} + {y} =", a: fmt(x + y)}
            for x in range(1, 10) for y in range(1, 10)][:n]
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- rg:<dataset> -----------------------------------------------------------------------------------------------------
def test_an_rg_dataset_by_name_samples_with_its_config_and_scores_with_score_answer():
    own = build_tasks([RG], {RG: EASY})
    items = sample_items([RG], 20, seed=3, task_families=own)
    assert items == sample_items([RG], 20, seed=3, task_families=own)
    assert items != sample_items([RG], 20, seed=4, task_families=own)
    assert all(i.family == RG and split_of(i.question) == "train" for i in items)
    for it in items:  # the config reached the generator: sums of two small numbers only
        a, b = it.question.removeprefix("Calculate ").rstrip(".").split(" + ")
        assert abs(int(a)) < 100 and abs(int(b)) < 100 and int(it.answer) == int(a) + int(b)
    fam, it = own[RG], items[0]
    right = fam.score(f"<answer>{it.answer}</answer>", it, "chat")
    partial = fam.score(f"<answer>{it.answer} apples</answer>", it, "chat")  # score_answer's partial credit
    wrong = fam.score(f"<answer>{int(it.answer) + 1}</answer>", it, "chat")
    assert (right.reward, right.correct) == (1.0, True)
    assert 0 < partial.reward < 1 and not partial.correct  # correct is binary: reward == 1 only
    assert (wrong.reward, wrong.correct) == (0.0, False)


def test_an_rg_eval_set_is_built_once_into_the_cache_and_disjoint_from_training(cache):
    own = build_tasks([RG], {RG: EASY})
    path = eval_path(RG, own)
    assert path.is_file() and cache in path.parents and DATA_DIR not in path.parents
    items = eval_set(RG, task_families=own)
    questions = [i.question for i in items]
    assert 1 <= len(items) <= USER_EVAL_SIZE and len(set(questions)) == len(questions)
    assert all(split_of(q) == "eval" for q in questions)
    train = {i.question for s in range(5) for i in sample_items([RG], 200, seed=s, task_families=own)}
    assert not train & set(questions)
    stamp = path.stat().st_mtime_ns
    assert eval_path(RG, own) == path and path.stat().st_mtime_ns == stamp  # frozen: not rebuilt
    # another config is another eval set (its own cache key); the first config's families still mean theirs
    minus = build_tasks([RG], {RG: {**EASY, "operators": ["-"]}})
    other = eval_path(RG, minus)
    assert other != path and all(" - " in i.question for i in eval_set(RG, limit=10, task_families=minus))
    assert eval_path(RG, own) == path
    # a stream with no held-out question is one clear error, not an empty eval set
    tiny = TASKS.build(RG, EASY)
    tiny.stream_len = 3
    with pytest.raises(ValueError, match="no eval question in 3 draws.*allowed"):
        tiny.eval_file()


def test_config_validates_rg_names_and_their_config_naming_the_field():
    cfg = Config(tasks=[RG], task_configs={RG: EASY}, eval_tasks=["gcd", RG])
    assert cfg.task_configs == {RG: EASY} and Config.from_dict(cfg.to_dict()) == cfg
    assert list(resolve(cfg).families) == [RG, "gcd"]
    cases = [
        (dict(tasks=["rg:basic_arithmetik"]), "'tasks'", "did you mean 'basic_arithmetic'"),
        (dict(tasks=["nope:x"]), "'tasks'", "rg:<reasoning-gym dataset>"),
        (dict(tasks=[RG], task_configs={RG: {"min_term": 2}}), "'task_configs'", "did you mean 'min_terms'"),
        (dict(tasks=[RG], task_configs={RG: {"min_terms": 0}}), "'task_configs'", "rejected by reasoning-gym"),
        (dict(tasks=[RG], task_configs={RG: {"seed": 1}}), "'task_configs'", "set by brorl_lab"),
        (dict(tasks=[RG], task_configs={RG: 2}), "'task_configs'", "dicts of settings"),
        (dict(tasks=["gcd"], task_configs={"gcd": {"max_value": 9}}), "'task_configs'", "built-in families take none"),
        (dict(tasks=[RG], task_configs={"rg:knights_knaves": {}}), "'task_configs'", f"({RG})"),
        (dict(task_configs=[RG]), "'task_configs'", "type dict"),
    ]
    for kw, field, needle in cases:
        with pytest.raises(ConfigError) as e:
            resolve(Config(**kw))  # the shape fails in Config, names and settings in resolve
        msg = str(e.value)
        assert field in msg and needle in msg and "allowed" in msg and len(msg.splitlines()) == 1, msg


# ---- local:<file> -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_local_file_splits_deterministically_and_scores_with_math_verify(tmp_path, suffix):
    path = write_sums(tmp_path / f"sums{suffix}", q="problem", a="solution")
    name = f"local:{path}"
    own = build_tasks([name], {name: {"question_column": "problem", "answer_column": "solution"}})
    fam = own[name]
    ev = eval_set(name, task_families=own)
    train = {i.question for s in range(3) for i in sample_items([name], 100, seed=s, task_families=own)}
    assert ev and train and not train & {i.question for i in ev}
    assert len(ev) + len(train) == 81  # every row on exactly one side (the train draws cycle through all)
    assert all(held_out(i.question, 0.125) for i in ev) and not any(held_out(q, 0.125) for q in train)
    a = sample_items([name], 30, seed=1, task_families=own)
    assert a == sample_items([name], 30, seed=1, task_families=own)
    assert a != sample_items([name], 30, seed=2, task_families=own)
    it = a[0]
    assert it.uid.startswith(f"{name}:")
    right, wrong = it.answer, str(int(it.answer) + 1)
    for response, template, ok in [(f" {right}", "plain", True), (f" {right}.0", "plain", True),
                                   (f"so \\boxed{{{right}}}", "chat", True), (f" {wrong}", "plain", False),
                                   (" 9^9^9", "plain", False)]:
        res = fam.score(response, it, template)
        assert res.correct == ok and res.reward == float(ok), (response, res)


def test_local_split_ignores_row_order_and_honours_eval_fraction_and_answer_after(tmp_path):
    a = write_sums(tmp_path / "a.jsonl", fmt=lambda s: f"reasoning ... #### {s}")
    lines = a.read_text().splitlines()
    b = tmp_path / "b.jsonl"
    b.write_text("\n".join(reversed(lines)) + "\n")
    conf = {"answer_after": "####", "eval_fraction": 0.5}
    own = build_tasks([f"local:{a}", f"local:{b}"], {f"local:{a}": conf, f"local:{b}": conf})
    ev_a = {(i.question, i.answer) for i in eval_set(f"local:{a}", task_families=own)}
    ev_b = {(i.question, i.answer) for i in eval_set(f"local:{b}", task_families=own)}
    assert ev_a == ev_b and 20 < len(ev_a) < 61  # about half of 81, whatever the row order
    assert all(ans.isdigit() for _, ans in ev_a)  # the reference is what follows '####'
    # the file edited since: the next resolve reads it again
    b.write_text("\n".join(lines[:40]) + "\n")
    spec = resolve(Config(tasks=[f"local:{b}"], task_configs={f"local:{b}": conf}))
    assert sum(len(rows) for rows in spec.families[f"local:{b}"].splits.values()) == 40


def test_two_configs_of_one_local_file_each_sample_their_own(tmp_path):
    """Building or resolving a Config writes no global state: a second Config with other task_configs for the
    same local: file changes nothing the first one's run samples (it used to: the last configuration won)."""
    name = f"local:{write_sums(tmp_path / 'qa.jsonl')}"
    first = Config(tasks=[name], task_configs={name: {"eval_fraction": 0.125}})
    before = resolve(first)
    items = sample_items([name], 40, seed=0, task_families=before.families)
    second = Config(tasks=[name], task_configs={name: {"eval_fraction": 0.75}})
    other = resolve(second)
    assert other.families[name] is not before.families[name]
    assert sample_items([name], 40, seed=0, task_families=before.families) == items  # the first keeps its own
    assert sample_items([name], 40, seed=0, task_families=resolve(first).families) == items
    # ... and each samples its own split: a quarter of the rows train for the second, seven eighths for the first
    train_first = {i.question for s in range(4) for i in sample_items([name], 100, seed=s,
                                                                      task_families=before.families)}
    train_second = {i.question for s in range(4) for i in sample_items([name], 100, seed=s,
                                                                       task_families=other.families)}
    assert train_second < train_first and len(train_second) < len(train_first) / 2
    assert name not in TASKS  # nothing was registered globally


def test_local_files_fail_with_the_field_and_what_is_allowed(tmp_path):
    good = write_sums(tmp_path / "qa.jsonl")
    (tmp_path / "qa.csv").write_text("question,answer\n1+1,2\n")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    one = write_sums(tmp_path / "one.jsonl", n=1)
    cases = [
        (dict(tasks=[f"local:{tmp_path}/missing.jsonl"]), "'tasks'", "does not exist"),
        (dict(tasks=[f"local:{tmp_path}/qa.csv"]), "'tasks'", ".parquet"),
        (dict(tasks=[f"local:{good}"], task_configs={f"local:{good}": {"question_column": "q"}}),
         "'task_configs'", "one of its columns (question, answer)"),
        (dict(tasks=[f"local:{good}"], task_configs={f"local:{good}": {"eval_fraction": 1.5}}),
         "'task_configs'", "eval_fraction"),
        (dict(tasks=[f"local:{good}"], task_configs={f"local:{good}": {"answer_colum": "a"}}),
         "'task_configs'", "did you mean 'answer_column'"),
        (dict(tasks=[f"local:{good}"], task_configs={f"local:{good}": {"answer_after": "####"}}),
         "'task_configs'", "lacks answer_after"),
        (dict(tasks=[f"local:{tmp_path}/bad.jsonl"]), "'tasks'", "bad.jsonl line 1"),  # the file, not its settings
        (dict(tasks=[f"local:{one}"]), "'task_configs'", "leaves no"),
    ]
    for kw, field, needle in cases:
        with pytest.raises(ConfigError) as e:
            resolve(Config(**kw))
        msg = str(e.value)
        assert field in msg and needle in msg and "allowed" in msg and len(msg.splitlines()) == 1, msg


# ---- end to end ------------------------------------------------------------------------------------------------------
def test_training_on_an_rg_dataset_and_a_local_file_with_the_default_model(tmp_path):
    from brorl_lab.rl.trainer import Trainer

    local = f"local:{write_sums(tmp_path / 'sums.jsonl')}"
    cfg = Config(tasks=[RG, local], task_configs={RG: EASY}, rollouts_per_prompt=4, prompts_per_step=2,
                 max_new_tokens=6, steps=2, eval_every=2, eval_prompts=8, eval_samples=2, eval_k=[1],
                 dynamic_sampling=False, run_dir=str(tmp_path / "runs"), torch_threads=1, seed=0)
    resolve(Config(tasks=[RG], task_configs={RG: {"operators": ["*"]}}))  # another config of the name: changes nothing
    with Trainer(cfg, progress=False) as t:
        df = t.run()
        assert all(" + " in i.question for i in t.spec.families[RG].sample(8, seed=0))  # the run's own config
    assert t.run_dir.path.parent == tmp_path / "runs" and t.run_dir.path.name.startswith(f"{RG}-local-sums_")
    assert df["step"].max() == 2
    ev = df.dropna(subset=[f"eval/{RG}/pass@1"])
    assert len(ev) == 2 and f"eval/{local}/pass@1" in df.columns
    # the default model knows one-digit sums in chain_sum's wording: math-verify scores some right
    assert ev[f"eval/{local}/pass@1"].max() > 0


def test_cli_eval_takes_user_tasks_and_their_configs(tmp_path, capsys):
    local = f"local:{write_sums(tmp_path / 'sums.jsonl')}"
    out = tmp_path / "m.json"
    assert cli.main(["eval", "--model", "default", "--tasks", RG, local, "--task-configs", json.dumps({RG: EASY}),
                     "--prompts", "4", "--samples", "2", "--k", "1", "--max-new-tokens", "6",
                     "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert {f"eval/{RG}/pass@1", f"eval/{local}/pass@1", "eval/mean/pass@1"} <= set(metrics)
    assert local in capsys.readouterr().out  # the table names the family, '/' and all
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--tasks", RG, "--task-configs", "[1]"])
    assert e.value.code == 2 and "JSON object" in capsys.readouterr().err


def test_metric_keys_of_a_family_with_slashes_parse_back():
    from brorl_lab.core.rundir import eval_key
    from brorl_lab.lab.analysis import families_of
    from brorl_lab.lab.plots import metric_label
    from brorl_lab.rl.evaluation import EvalResult

    key = "eval/local:data/qa.jsonl/pass@4"
    assert eval_key(key) == ("local:data/qa.jsonl", "pass@4") and eval_key("loss") is None
    assert metric_label(key) == "local:data/qa.jsonl pass@4 (eval)"
    table = EvalResult({key: 0.5, "eval/gcd/pass@4": 0.25}, pd.DataFrame()).table()
    assert table.loc["local:data/qa.jsonl", "pass@4"] == 0.5 and table.loc["gcd", "pass@4"] == 0.25
    cols = ["eval/local:data/qa.jsonl/pass@1", "eval/mean/pass@1", "eval/gcd/pass@1"]
    assert families_of(pd.DataFrame(columns=cols)) == ["local:data/qa.jsonl", "gcd", "mean"]


def test_a_malformed_jsonl_names_the_tasks_field_the_file_and_the_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"question": "1+1", "answer": "2"}\n\n{"question": "2+2", "answer": \n')
    with pytest.raises(ConfigError) as e:
        resolve(Config(tasks=[f"local:{path}"]))
    msg = str(e.value)
    assert msg.startswith("config field 'tasks'") and f"{path} line 3" in msg and "got {}" not in msg, msg


def test_a_pool_trains_on_its_items_and_holds_out_its_eval_file_scoring_each_by_its_family(tmp_path):
    """pool:<file> restricts a family to fixed items (the regime map's constructed settings): training draws only
    pool items, the eval set is the held-out file, and formatting and scoring are the items' own family's."""
    from brorl_lab.rollout.tasks.sets import write_items
    from brorl_lab.rollout.tasks.user import pool_eval_path

    train = sample_items(["products"], 6, seed=1)
    held = sample_items(["products"], 3, seed=2, split="eval")
    path = write_items(train[:3], tmp_path / "band.jsonl")
    write_items(held, pool_eval_path(path))
    fam = build_tasks([f"pool:{path}"])[f"pool:{path}"]
    drawn = fam.sample(5, seed=0)
    assert {it.uid for it in drawn} == {it.uid for it in train[:3]}  # only pool items, each before any repeat
    assert [it.uid for it in eval_set(f"pool:{path}", task_families={fam.name: fam})] == [it.uid for it in held]
    own = TASKS.get("products")
    item = train[0]
    assert fam.format_prompt(item, "plain") == own.format_prompt(item, "plain")
    assert fam.score(item.answer, item).correct and not fam.score("-1", item).correct
    cfg = Config(tasks=[f"pool:{path}"])
    assert set(resolve(cfg).families) == {f"pool:{path}"}
    write_items(train[:1], pool_eval_path(path))  # a held-out item also in the pool: refused
    with pytest.raises(ValueError, match="in both the pool and its eval_file"):
        build_tasks([f"pool:{path}"])
    with pytest.raises(ValueError, match="does not exist or is not .jsonl"):
        build_tasks([f"pool:{tmp_path / 'none.jsonl'}"])


def test_a_pool_or_local_file_samples_by_its_content_not_its_path(tmp_path):
    """The same pool (or local file) at two paths draws the same items in the same order: the draws are seeded by
    the content. They used to be seeded by the path, so the regime map's constructed settings gave other numbers
    whenever the run directory moved."""
    from brorl_lab.rollout.tasks.sets import write_items
    from brorl_lab.rollout.tasks.user import pool_eval_path

    train, held = sample_items(["gcd"], 12, seed=3), sample_items(["gcd"], 4, seed=4, split="eval")
    draws = []
    for where in ("a", "b/deeper"):
        (tmp_path / where).mkdir(parents=True)
        path = write_items(train, tmp_path / where / "band.jsonl")
        write_items(held, pool_eval_path(path))
        fam = build_tasks([f"pool:{path}"])[f"pool:{path}"]
        draws.append([it.uid for it in fam.sample(20, seed=7)])
    assert draws[0] == draws[1] and draws[0][:12] != [it.uid for it in train]  # the same shuffle, not the file order
    shuffled = build_tasks([f"pool:{tmp_path / 'a' / 'band.jsonl'}"])[f"pool:{tmp_path / 'a' / 'band.jsonl'}"]
    assert [it.uid for it in shuffled.sample(20, seed=8)] != draws[0]  # another seed, another order
    rows = []
    for where in ("x", "y"):
        (tmp_path / where).mkdir()
        name = f"local:{write_sums(tmp_path / where / 'qa.jsonl')}"
        fam = build_tasks([name])[name]
        rows.append([it.meta["row"] for it in fam.sample(30, seed=5)])
    assert rows[0] == rows[1]
