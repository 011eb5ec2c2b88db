"""The "code" task family: generated specs, prompts, extraction, and rewards from unit tests run in the sandbox."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from brorl_lab.rollout.sandbox import UnitTest, run_untrusted
from brorl_lab.rollout.tasks import TASKS, RewardResult, TaskItem
from brorl_lab.rollout.tasks import code as C
from brorl_lab.rollout.tasks import templates as T
from brorl_lab.rollout.tasks.gym import split_of

FAM = TASKS["code"]


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution:\n```{lang}\n{code}\n```\nDone."


def lookup_solution(item: TaskItem, right: int) -> str:
    """A solution answering the first ``right`` tests correctly and every other call with a wrong value."""
    name = item.meta["spec"]
    table = {t["call"]: t["expected"] for t in item.meta["tests"][:right]}
    return (f"_T = {json.dumps(table)!r}\nimport json\n_T = json.loads(_T)\n"
            f"def {name}(*args):\n    return _T.get(_call(args), 'wrong')\n"
            f"def _call(args):\n    return '{name}(' + ', '.join(repr(a) for a in args) + ')'\n")


def one_item_per_spec() -> list[TaskItem]:
    found: dict[str, TaskItem] = {}
    for split in ("train", "eval"):
        for item in FAM.sample(1500, seed=1, split=split):
            found.setdefault(item.meta["spec"], item)
    return list(found.values())


def test_family_is_registered_with_unique_spec_names():
    assert "code" in TASKS.names() and TASKS.get("code") is FAM
    assert 30 <= len(C.SPECS) <= 60 and len({s.name for s in C.SPECS}) == len(C.SPECS)


def test_reference_solutions_of_every_spec_pass_all_their_tests_in_the_sandbox():
    items = one_item_per_spec()
    assert {i.meta["spec"] for i in items} == {s.name for s in C.SPECS}
    assert all(C.MIN_TESTS <= len(i.meta["tests"]) <= C.MAX_TESTS for i in items)
    # One sandbox run for all specs (their function names differ): the stored expected values, computed here by
    # the reference solutions, must survive the trip through the sandbox and its comparison.
    tests = [UnitTest(t["call"], t["expected"]) for i in items for t in i.meta["tests"]]
    res = run_untrusted("\n".join(i.answer for i in items), tests, wall_timeout=20.0)
    assert (res.status, res.passed) == ("ok", len(tests)), [(t.call, o) for t, o in zip(tests, res.outcomes)
                                                            if o != "pass"]
    for item in items[:3]:  # and through the family's own scoring
        assert FAM.score(fenced(item.answer), item) == RewardResult(1.0, True, item.answer.strip("\n"),
                                                                    f"{len(item.meta['tests'])}/"
                                                                    f"{len(item.meta['tests'])} tests passed")


def test_sampling_is_deterministic_and_splits_are_disjoint_by_spec():
    a, b = FAM.sample(50, seed=3), FAM.sample(50, seed=3)
    assert [asdict(i) for i in a] == [asdict(i) for i in b]
    assert [i.question for i in FAM.sample(50, seed=4)] != [i.question for i in a]
    assert all(i.uid.startswith("code:train:3:") for i in a) and len({i.uid for i in a}) == len(a)
    train = FAM.sample(800, seed=0, split="train")
    evals = FAM.sample(200, seed=0, split="eval")
    statement = lambda i: i.question.split("\n")[0]  # noqa: E731  (the spec, without its example)
    assert all(split_of(statement(i)) == "train" for i in train)
    assert all(split_of(statement(i)) == "eval" for i in evals)
    assert not {statement(i) for i in train} & {statement(i) for i in evals}
    assert len({i.question for i in evals}) > 150  # enough distinct eval questions for a frozen set
    for i in train[:50]:  # the example shown is not one of the hidden tests
        assert not any(t["call"] in i.question for t in i.meta["tests"])
    assert FAM.sample(0, seed=0) == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(count=-1, seed=0), "count"), (dict(count=2, seed=-5), "seed"),
    (dict(count=2, seed=0, split="test"), "split"),
])
def test_bad_sample_arguments_raise_one_clear_error(kwargs, match):
    count = kwargs.pop("count")
    with pytest.raises(ValueError, match=match):
        FAM.sample(count, **kwargs)


def test_prompts_plain_chat_fallback_and_the_tokenizers_chat_template():
    from helpers_models import tiny_tokenizer

    item = FAM.sample(1, seed=0)[0]
    assert FAM.format_prompt(item) == f"{item.question}\nAnswer:"
    fallback = FAM.format_prompt(item, "chat")
    assert fallback == T.CHAT_FALLBACK.format(content=C.CHAT_CODE.format(question=item.question))
    assert "```python" in fallback
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert FAM.format_prompt(item, "chat", tok) == f"<|user|>{C.CHAT_CODE.format(question=item.question)}\n<|assistant|>"
    with pytest.raises(ValueError, match="template"):
        FAM.format_prompt(item, "fancy")


@pytest.mark.parametrize("response, expected", [
    ("```python\ndef a():\n    return 1\n```\ntext\n```\ndef b():\n    return 2\n```", "def b():\n    return 2"),
    ("def c(x):\n    return x\n", "def c(x):\n    return x"),
    ("I think:\n```py\ndef d():\n    return 4\n", "def d():\n    return 4"),  # truncated: no closing fence
    ("   \n", None),
    (None, None),
])
def test_extraction_takes_the_last_fenced_block_or_the_whole_response(response, expected):
    assert C.extract_code(response) == expected


def test_partial_solution_scores_the_fraction_of_tests_it_passes():
    item = next(i for i in FAM.sample(40, seed=2) if len(i.meta["tests"]) >= 4)
    total = len(item.meta["tests"])
    res = FAM.score(fenced(lookup_solution(item, 2)), item)
    assert res.reward == pytest.approx(2 / total) and not res.correct
    assert res.info == f"2/{total} tests passed"
    res = FAM.score(lookup_solution(item, total), item)  # unfenced: the whole response is the code
    assert (res.reward, res.correct) == (1.0, True)


def test_malformed_erroring_slow_and_broken_inputs_score_zero_and_never_raise():
    item = next(i for i in FAM.sample(20, seed=5) if i.meta["spec"] != "collatz_steps")
    quick = C.CodeFamily(wall_timeout=1.0)
    cases = {
        "no code found": "",
        "exec_error": fenced("def broken(:\n    pass"),
        "exec_error: RuntimeError": fenced(item.answer + "\nraise RuntimeError('at import')\n"),
        "timeout": fenced(item.answer + "\nwhile True:\n    pass\n"),
        "longer than": "x = 1\n" * (C.MAX_CODE_CHARS // 6 + 10),
    }
    for why, response in cases.items():
        res = quick.score(response, item)
        assert (res.reward, res.correct) == (0.0, False) and why in res.info, (why, res)
    assert quick.score(12345, item).info == "no code found"  # not a string
    broken = TaskItem("code", "code:x", "q", "a", meta={})
    res = quick.score(fenced(item.answer), broken)
    assert res.reward == 0.0 and res.info.startswith("verifier error: KeyError")
    with pytest.raises(ValueError, match="template"):
        quick.score(fenced(item.answer), item, template="fancy")


def test_items_survive_the_jsonl_round_trip_of_frozen_eval_sets():
    item = FAM.sample(1, seed=9, split="eval")[0]
    back = TaskItem(**json.loads(json.dumps(asdict(item), sort_keys=True)))
    assert back == item and FAM.score(fenced(back.answer), back).correct


@pytest.mark.parametrize("kwargs, match", [(dict(wall_timeout=0), "wall_timeout"),
                                           (dict(memory_mb=8), "memory_mb"), (dict(memory_mb="512"), "memory_mb")])
def test_bad_family_limits_raise_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        C.CodeFamily(**kwargs)
