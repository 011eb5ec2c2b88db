"""notebooks/07_write_the_loop: its exercises (each stub, as written in the notebook, fails its check; each solution
passes) and a headless run of the loop at a test size."""

import ast
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


@pytest.mark.notebook
def test_the_loop_runs_headless_on_the_pieces_and_updates_the_model(tmp_path, monkeypatch):
    """The whole notebook under papermill at a test size, with the solutions as the student's pieces: every check
    passes and says it ran the solution, the answers print before and after, and the loop made optimizer steps.

    The rise of held-out pass@1 is not asserted here: at a size a test can afford (a few steps of 4 x 8 from the
    takeoff base, which solves spell_backward about once in 50 to 250 draws) most groups are all wrong and the loop
    barely updates; the default model (which solves most words) is used so that groups are mixed and the loop must
    update. The notebook's defaults and their measured rise are in its first cell."""
    from helpers_notebooks import execute_small

    run = execute_small(NOTEBOOK, tmp_path, dict(use_solutions=True, model="default", steps=3, prompts_per_step=4,
                                                 rollouts_per_prompt=8, eval_prompts=8, eval_samples=2, broad_n=16),
                        monkeypatch)
    text = run["text"]
    assert text.count(": correct") == len(EXERCISES) == text.count("this run used the reference solution")
    assert "the base, before RL:" in text and "after 3 steps of 4 x 8:" in text
    done = [line for line in text.splitlines() if line.startswith("N = 8: step    3")]
    assert done and int(done[0].split(", ")[1].split()[0]) > 0, text[-2000:]  # optimizer steps were taken
    assert "held-out pass@1" in text and "N = 16:" in text
