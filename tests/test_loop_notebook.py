"""notebooks/07_write_the_loop: its exercises (each stub, as written in the notebook, fails its check; each solution
passes) and a headless run of the loop at a test size."""

import ast
import re
from pathlib import Path

import nbformat
import pytest
import torch
from helpers_notebooks import assert_notebook_pair_in_sync, exercise_names

from brorl_lab.lab import course

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_write_the_loop.ipynb"
EXERCISES = {"response_logprobs": course.check_response_logprobs,
             "grpo_advantage": lambda f: course.check_advantage(f, "grpo"),
             "rloo_advantage": lambda f: course.check_advantage(f, "rloo"),
             "ppo_clip_loss": course.check_ppo_clip_loss, "kl_estimate": course.check_kl_estimators,
             "spell_backward_reward": course.check_reward, "keep_groups": course.check_keep_groups}
PARAMS = ["model", "task", "pieces", "steps", "prompts_per_step", "rollouts_per_prompt", "minibatches", "lr",
          "eps_low", "eps_high", "kl_beta", "kl_estimator", "broad_n", "eval_prompts", "eval_samples", "seed",
          "torch_threads", "use_solutions"]


def test_pair_in_sync_and_every_exercise_has_a_check_and_a_solution():
    assert_notebook_pair_in_sync("07_write_the_loop", PARAMS)
    assert exercise_names(NOTEBOOK) == list(EXERCISES)


def notebook_stubs() -> dict:
    """The exercise functions exactly as the notebook's cells define them (``@exercise`` left as the identity)."""
    namespace = {"torch": torch, "exercise": lambda fn: fn}
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if "exercise" in cell.metadata.get("tags", []):
            exec(compile(ast.parse(cell.source), str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - our own cells
    return {name: namespace[name] for name in EXERCISES}


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_stub_fails_its_check_and_its_solution_passes(name):
    with pytest.raises(course.NotYet, match="not yet"):
        EXERCISES[name](notebook_stubs()[name])
    assert "correct" in EXERCISES[name](getattr(course.load_solutions("07_write_the_loop"), name))


#: The loop's test size: the takeoff base on gcd, which it answers right about 1 time in 4, so most groups of 8 are
#: mixed and every step updates. The notebook's defaults (spell_backward, solved once in 50 to 250 draws) rise only
#: after some 300 steps of 32 x 16, minutes of CPU beyond a test. lr 2e-4: at the notebook's 5e-4 one seed of three
#: collapsed onto answering "2" (held-out pass@1 +3.5 points after 100 steps).
LOOP_TEST = dict(use_solutions=True, task="gcd", steps=80, prompts_per_step=16, rollouts_per_prompt=8, lr=2e-4,
                 eval_prompts=100, eval_samples=4, broad_n=0)
RISE = 0.12  # the held-out pass@1 rise (a fraction) the test size must reach: a margin under the lowest measured


@pytest.mark.notebook
def test_the_loop_on_the_students_pieces_raises_held_out_pass_at_1(tmp_path, monkeypatch):
    """The whole notebook under papermill at the test size, with the solutions as the student's pieces (the exact-
    answer verifier of exercise 5 scores gcd's one-number answers too): every check passes and says it ran the
    solution, the answers print before and after, and held-out pass@1 (100 frozen gcd prompts x 4 samples, the
    library's evaluation) rises by at least RISE.

    Measured 2026-12-07 at lr 2e-4 and 16 x 8 (load 14 to 23 on the 2 cores): after 80 steps +22.3, +19.4 and +18.7
    points at seeds 0, 1, 2 (runs of 160 steps, read at step 80; they end at +23.0, +20.2, +18.5: a plateau near
    0.43); after 100 steps +20.2 and +19.5 (seeds 0, 2). Not the 20 points the notebook's defaults reach on
    spell_backward (stated in its first cell): gcd's rise plateaus there, and it is mostly the base learning to
    choose between the commonest answers, 1 and 2 (its answers before and after show it), not to compute a GCD.

    Other test sizes tried for a rise of 20 points (2026-12-07 evening, one seed each unless said, 16 x 8, 100 x 4
    held-out): gcd at lr 3e-4 +18.3 and +19.2 (seeds 0, 1; 80 steps), +17.5 (seed 2, 120 steps), at 16 x 16 +19.5:
    gcd's rise tops out near 0.42. From the takeoff base products -0.5, simple_equations +4.0 (lr 2e-4) and +7.0
    (5e-4), chain_sum -3.0 and -2.7; from data/default_model chain_sum -8.5 and simple_equations -4.0 (80 steps
    each): no task here reaches 20 points in a test-sized run; spell_backward does at the notebook's defaults."""
    from helpers_notebooks import execute_small

    run = execute_small(NOTEBOOK, tmp_path, LOOP_TEST, monkeypatch)
    text = run["text"]
    assert text.count(": correct") == len(EXERCISES) == text.count("this run used the reference solution")
    assert "the base, before RL:" in text and "after 80 steps of 16 x 8:" in text
    rise = re.search(r"held-out pass@1 ([0-9.]+) -> ([0-9.]+) \(([+-][0-9.]+) points\)", text)
    assert rise and float(rise[3]) / 100 >= RISE, text[-2500:]
    print(f"the loop at its test size: {rise[0]}")
