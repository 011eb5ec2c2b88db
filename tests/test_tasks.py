"""Task families, mixing, templates and the frozen eval sets (real reasoning-gym generators, no fakes)."""

from __future__ import annotations

from collections import Counter

import pytest

from brorl_lab.rollout import make_data, tasks
from brorl_lab.rollout.tasks import TASKS, TaskItem, eval_set, sample_items
from brorl_lab.rollout.tasks import templates as T
from brorl_lab.rollout.tasks.gym import EVAL_MODULUS, split_of

FAMILIES = list(make_data.DEFAULT_EVAL_FAMILIES)


def test_registry_has_the_families_and_rejects_unknown_names_with_a_suggestion():
    assert {"chain_sum", "spell_backward", "gcd", "products", "simple_equations"} <= set(TASKS.names())
    with pytest.raises(ValueError, match=r"'chain_sun'.*did you mean 'chain_sum'"):
        tasks.get_task("chain_sun")
    with pytest.raises(ValueError, match=r"'gdc'.*did you mean 'gcd'"):
        sample_items(["chain_sum", "gdc"], 4, seed=0)


def test_sample_items_is_deterministic_per_seed_and_mixes_uniformly():
    a = sample_items(FAMILIES, 41, seed=7)
    b = sample_items(FAMILIES, 41, seed=7)
    c = sample_items(FAMILIES, 41, seed=8)
    assert [i.uid for i in a] == [i.uid for i in b] and [i.question for i in a] == [i.question for i in b]
    assert [i.question for i in a] != [i.question for i in c]
    counts = Counter(i.family for i in a)
    assert set(counts) == set(FAMILIES) and max(counts.values()) - min(counts.values()) <= 1
    order = [i.family for i in a]
    assert order != sorted(order)  # positions are shuffled, not blocks
    assert sample_items("gcd", 3, seed=1) == sample_items(["gcd"], 3, seed=1)
    assert sample_items(FAMILIES, 0, seed=0) == []


@pytest.mark.parametrize("kwargs, field", [
    (dict(names=[], count=2, seed=0), "names"),
    (dict(names=["gcd", "gcd"], count=2, seed=0), "names"),
    (dict(names=["gcd"], count=-1, seed=0), "count"),
    (dict(names=["gcd"], count=2.0, seed=0), "count"),
    (dict(names=["gcd"], count=2, seed=-3), "seed"),
    (dict(names=["gcd"], count=2, seed=0, split="test"), "split"),
])
def test_sample_items_rejects_bad_arguments_naming_them(kwargs, field):
    names = kwargs.pop("names")
    with pytest.raises(ValueError, match=rf"^{field}: got"):
        sample_items(names, **kwargs)


def test_items_carry_reference_answers_that_the_generator_computed():
    for item in sample_items(["chain_sum", "products"], 40, seed=3):
        expr = item.meta["entry"]["metadata"].get("expression") or item.question.split(": ")[1].split(".")[0]
        assert eval(expr.rstrip(" =")) == int(item.answer), item.question  # noqa: S307
    for item in sample_items(["spell_backward"], 20, seed=3):
        assert item.answer == item.meta["entry"]["metadata"]["word"][::-1] and item.question.endswith(
            ": " + item.answer[::-1])


@pytest.mark.parametrize("name", FAMILIES)
def test_eval_set_is_frozen_and_disjoint_from_a_large_train_sample(name):
    items = eval_set(name)
    assert len(items) == make_data.EVAL_SIZE
    assert all(i.family == name and i.uid.startswith(f"{name}:eval:") for i in items)
    assert len({i.uid for i in items}) == len(items)  # repeated questions are kept (drawn like training), uids not
    questions = {i.question for i in items}
    assert all(split_of(q) == "eval" for q in questions)
    train = TASKS[name].sample(2000, seed=0, split="train") + sample_items([name], 500, seed=12345)
    assert not questions & {i.question for i in train}
    assert eval_set(name, limit=5) == items[:5]


# A feature per family the old "first 200 distinct questions" rule skewed (products: 6.5% one-digit against 50%,
# gcd: 30.5% coprime against 23%); strata features (digits, terms, word length) and one the strata do not fix
# (coprime gcd pairs, two-digit simple_equations answers).
FEATURES = {"products": lambda i: i.meta["entry"]["metadata"]["num_digits"] == 1,
            "gcd": lambda i: i.answer == "1",
            "chain_sum": lambda i: i.meta["entry"]["metadata"]["num_terms"] == 2,
            "spell_backward": lambda i: len(i.answer) == 3,
            "simple_equations": lambda i: len(i.answer.lstrip("-")) == 2}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_eval_set_is_distributed_like_the_training_stream(name):
    feature, items = FEATURES[name], eval_set(name)
    train = TASKS[name].sample(4000, seed=1, split="train")  # a training stream the eval sets were not fit to
    q = sum(map(feature, train)) / len(train)
    share = sum(map(feature, items)) / len(items)
    se = (q * (1 - q) / len(items) + q * (1 - q) / len(train)) ** 0.5  # two binomial shares
    assert abs(share - q) < 3 * se, (name, share, q)
    assert not {i.question for i in items} & {i.question for i in train}


def test_eval_strata_follow_the_training_shares():
    counts = make_data.stratum_counts("chain_sum", 200, reference=2000)
    assert sum(counts.values()) == 200 and set(counts) == {(("num_terms", t), ("num_digits", 1)) for t in (2, 3)}
    assert 80 <= counts[(("num_terms", 2), ("num_digits", 1))] <= 120  # about half the training draws have 2 terms
    assert make_data.stratum(TaskItem("code", "u", "q", "a")) == ()


def test_eval_split_holds_about_one_question_in_eval_modulus():
    qs = {i.question for i in TASKS["chain_sum"].sample(2000, seed=1, split="train")}
    # a train stream never yields eval questions; the raw hash partition is ~1/EVAL_MODULUS
    assert all(split_of(q) == "train" for q in qs)
    raw = [f"question {k}" for k in range(4000)]
    share = sum(split_of(q) == "eval" for q in raw) / len(raw)
    assert abs(share - 1 / EVAL_MODULUS) < 0.03


def test_make_data_reproduces_the_committed_eval_files(tmp_path):
    paths = make_data.make_eval_sets(["chain_sum", "gcd"], out_dir=tmp_path)
    for name, path in paths.items():
        assert path.read_text() == tasks.eval_path(name).read_text()


def test_eval_set_errors_name_the_task_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"unknown task 'gcdd'.*did you mean 'gcd'"):
        eval_set("gcdd")
    with pytest.raises(ValueError, match=r"^limit: got -1"):
        eval_set("gcd", limit=-1)
    monkeypatch.setattr(tasks.base, "EVAL_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"eval set for task 'gcd'.*make-data --families gcd"):
        eval_set("gcd")


def test_plain_and_chat_templates_are_the_documented_strings():
    item = eval_set("gcd", limit=1)[0]
    assert TASKS["gcd"].format_prompt(item, "plain") == item.question + "\nAnswer:"
    chat = TASKS["gcd"].format_prompt(item, "chat")
    assert chat == T.CHAT_FALLBACK.format(content=T.CHAT_ANSWER_TAGS.format(question=item.question))
    math_item = eval_set("simple_equations", limit=1)[0]
    assert "\\boxed{}" in TASKS["simple_equations"].format_prompt(math_item, "chat")
    with pytest.raises(ValueError, match=r"^template: got 'fancy'"):
        TASKS["gcd"].format_prompt(item, "fancy")
    assert T.resolve_template("auto", "default") == "plain" and T.resolve_template("auto", "Qwen/x") == "chat"


def test_chat_template_uses_the_tokenizers_own_chat_template():
    from brorl_lab.core.models import load_tokenizer

    tok = load_tokenizer("default")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    item = eval_set("chain_sum", limit=1)[0]
    prompt = TASKS["chain_sum"].format_prompt(item, "chat", tok)
    assert prompt == f"<|user|>{T.CHAT_ANSWER_TAGS.format(question=item.question)}\n<|assistant|>"


@pytest.mark.parametrize("response, template, expected", [
    (" 57", "plain", "57"),
    ("\n\n 57\nmore text", "plain", "57"),
    ("think... <answer> 12 </answer> then <answer>13</answer>", "chat", "13"),
    ("so \\boxed{\\frac{1}{2}} done", "chat", "\\frac{1}{2}"),
    ("\\boxed{1} and \\boxed{2", "chat", None),  # unclosed last box: no answer rather than a guess
    ("the answer is 57", "chat", None),  # chat output without tags or box is a format failure
    ("", "plain", None),
    ("   \n ", "plain", None),
    (None, "plain", None),
    (57, "plain", None),
])
def test_extract_answer(response, template, expected):
    assert T.extract_answer(response, template) == expected
