"""Hands-on exercises in the notebooks: the student's function, or the reference solution kept apart.

A notebook exercise is a function the student writes (its body a ``# TODO`` stub that returns a placeholder),
followed by a *check* cell that asserts the function against the library (``theory.mass_balance``, the exact
softmax change, ``rl.algo``). The solutions live in a separate file, ``notebooks/solutions/<notebook>.py``, one
function of the same name per exercise, so that running a notebook never "passes" an exercise by itself::

    exercise = Exercises("01_mass_balance_theory", use_solutions)   # use_solutions: a papermill parameter

    @exercise
    def logit_update(p, correct, counts, *, lr=1.0, r_c=1.0, r_w=-1.0):
        ...                                                        # TODO: the student's code

With ``use_solutions`` False (a student's run, the default of every notebook) ``@exercise`` returns the student's
function unchanged, and a stub fails its check. True (the tests, the book) swaps in the reference solution; a
collection of names swaps in only those (a test leaves one out to show that its stub fails its check).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Union

from brorl_lab.core.paths import NOTEBOOK_DIR

SOLUTIONS_DIR = NOTEBOOK_DIR / "solutions"


def load_solutions(notebook: str, solutions_dir: Path = SOLUTIONS_DIR) -> ModuleType:
    """The module ``<solutions_dir>/<notebook>.py`` (e.g. notebooks/solutions/01_mass_balance_theory.py)."""
    path = Path(solutions_dir) / f"{notebook}.py"
    if not path.is_file():
        raise FileNotFoundError(f"notebook: no solutions file {path.name} in {solutions_dir} for {notebook!r}")
    spec = importlib.util.spec_from_file_location(f"brorl_solutions_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Exercises:
    """A decorator for a notebook's exercise functions: the student's version, or the solution of the same name.

    ``use_solutions``: False (the student's functions), True (every solution) or a collection of exercise names
    (those solutions only). ``names`` lists the exercises decorated so far, in order; ``solved`` those replaced.
    """

    def __init__(self, notebook: str, use_solutions: Union[bool, Collection[str]] = False, *,
                 solutions_dir: Path = SOLUTIONS_DIR):
        if not isinstance(use_solutions, (bool, list, tuple, set, frozenset)):
            raise ValueError(f"use_solutions: got {use_solutions!r}; allowed: True, False or a list of exercise names")
        self.notebook, self.use_solutions, self.solutions_dir = notebook, use_solutions, Path(solutions_dir)
        self.names: list[str] = []
        self.solved: list[str] = []
        self._module: ModuleType | None = None

    def wants(self, name: str) -> bool:
        return self.use_solutions is True or (not isinstance(self.use_solutions, bool) and name in self.use_solutions)

    def __call__(self, fn: Callable) -> Callable:
        name = fn.__name__
        self.names.append(name)
        if not self.wants(name):
            return fn
        if self._module is None:
            self._module = load_solutions(self.notebook, self.solutions_dir)
        solution = getattr(self._module, name, None)
        if not callable(solution):
            raise ValueError(f"use_solutions: {self.notebook}'s solutions file has no function {name!r}")
        self.solved.append(name)
        return solution

    def said(self, line: str, name: str) -> str:
        """A check's success ``line``, marked when the exercise ``name`` ran the kept-apart solution (the book and the
        tests run them), so a reader of an executed notebook knows the stub above was not what passed."""
        if name not in self.solved:
            return line
        return f"{line}\n(this run used the reference solution, notebooks/solutions/{self.notebook}.py:{name}, as the " \
               "book does; the stub above is yours to fill)"


# ---- the checks: the student's function against the library, on random and edge inputs -----------------------------
# Each check runs named cases, compares with brorl_lab (rl.algo, rollout.rewards) or an independent formula, and
# raises NotYet naming the case (which input) and the part that differs (which term, which rows) without printing the
# expected values. It returns one line to print on success. The reference solutions in notebooks/solutions/ share
# none of this code.
class NotYet(AssertionError):
    """A check failed: the message says on which input and where (which term, which group, which tokens)."""


def _as_tensor(value, name: str, case: str):
    import torch

    if not isinstance(value, torch.Tensor):
        raise NotYet(f"not yet ({case}): {name} returned a {type(value).__name__}, not a torch.Tensor")
    return value


def _compare(mine, ref, *, what: str, case: str, atol: float = 1e-5, rtol: float = 1e-5, rows: str = "row") -> None:
    """mine == ref (shape and values, NaN never equal); else NotYet naming the case and the first rows that differ."""
    import torch

    mine = _as_tensor(mine, what, case)
    if tuple(mine.shape) != tuple(ref.shape):
        raise NotYet(f"not yet ({case}): {what} has shape {tuple(mine.shape)}; the input asks for {tuple(ref.shape)}")
    mine = mine.detach().to(ref.dtype)
    if not torch.isfinite(mine).all():
        bad = (~torch.isfinite(mine)).nonzero()[0].tolist()
        raise NotYet(f"not yet ({case}): {what} is {mine[tuple(bad)].item()} at {rows} {bad}; every value must be finite")
    close = torch.isclose(mine, ref, rtol=rtol, atol=atol)
    if not close.all():
        where = (~close).nonzero()
        first = where[0].tolist() if where.ndim > 1 else [int(where[0])]
        raise NotYet(f"not yet ({case}): {what} is off at {int((~close).sum())} of {close.numel()} entries, first at "
                     f"{rows} {first}")


def _run_cases(cases, fn, *, what: str, atol: float = 1e-5, rows: str = "row") -> int:
    """Compare ``fn(*args)`` with ``ref`` for each ``(case, args, ref)``; NotYet at the first that differs."""
    for case, args, ref in cases:
        _compare(fn(*args), ref, what=what, case=case, atol=atol, rows=rows)
    return len(cases)


def _reward_groups(seed: int = 0):
    """Named reward groups [P, N]: random binary and partial credit, uniform at 0.1 (the float mean misses 0.1 by
    an ulp) and at 0, one success among many, repeated identical draws, a group of one."""
    import torch

    g = torch.Generator().manual_seed(seed)
    binary = (torch.rand(6, 8, generator=g) < 0.3).float()                    # [6, 8]
    binary[0] = 0.0
    binary[0, 3] = 1.0                                                        # one success in a group
    partial = torch.round(torch.rand(4, 5, generator=g) * 4) / 4              # [4, 5] partial credit
    return [("random binary rewards, 6 groups of 8", binary),
            ("partial-credit rewards in quarters, 4 groups of 5", partial),
            ("a uniform group: all rewards 0.1", torch.full((1, 8), 0.1)),
            ("uniform groups: all 0.1, all 0, all 1", torch.tensor([[0.1] * 3, [0.0] * 3, [1.0] * 3])),
            ("a group of two, repeated draws [1, 1, 0, 0]", torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])),
            ("one success among 512", torch.nn.functional.one_hot(torch.tensor([7]), 512).float()),
            ("a group of one (N = 1)", torch.tensor([[1.0], [0.0], [0.1]]))]


def check_advantage(fn: Callable, kind: str = "grpo", *, eps: float = 1e-6) -> str:
    """``fn(rewards [P, N]) -> [P, N]`` against ``rl.algo.grpo`` (std with N - 1, + eps) or ``rl.algo.rloo``.

    Every uniform group (including a group of one, where the library refuses: no baseline exists) must get exactly 0.
    """
    import torch

    from brorl_lab.rl import algo

    if kind not in ("grpo", "rloo"):
        raise ValueError(f"kind: got {kind!r}; allowed: 'grpo' or 'rloo'")
    name = f"{kind}_advantage"
    for case, rewards in _reward_groups():
        mine = _as_tensor(fn(rewards.clone()), name, case)
        uniform = rewards.amax(1) == rewards.amin(1)                          # [P]
        if rewards.shape[1] == 1:
            ref = torch.zeros_like(rewards)
        else:
            ref = algo.grpo(rewards, std_norm=True, eps=eps) if kind == "grpo" else algo.rloo(rewards)
        if tuple(mine.shape) == tuple(rewards.shape) and uniform.any():
            off = mine.detach()[uniform] != 0                                 # [U, N] exactly 0, not 1e-7
            if off.any():
                p = int(uniform.nonzero()[off.any(1).nonzero()[0]])
                raise NotYet(f"not yet ({case}): group {p} is uniform (all rewards {rewards[p, 0].item():g}) but its "
                             f"advantages are not exactly 0 (largest {mine.detach()[p].abs().max().item():.3g}); "
                             "a float mean can miss the rewards by an ulp, so test for uniform groups")
        _compare(mine, ref, what=name, case=case, rows="[group, sample]")
    return f"your advantages match rl.algo.{kind} on {len(_reward_groups())} cases ({kind.upper()}): correct"


def check_response_logprobs(fn: Callable, *, seed: int = 0) -> str:
    """``fn(logits [b, L, V], input_ids [b, L], prompt_len) -> [b, L - prompt_len]``: log pi(token t | tokens < t) of
    each response token, the logits at position t - 1 predicting token t (checked against
    torch.distributions.Categorical, and against the library's rl.logprobs on the tiny model)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cases = []
    for case, b, length, vocab, prompt_len, scale in (("random logits, b=3, L=9, V=11, prompt of 4", 3, 9, 11, 4, 3.0),
                                                      ("a prompt of one token", 2, 6, 7, 1, 1.0),
                                                      ("a response of one token", 2, 5, 7, 4, 5.0),
                                                      ("large logits (scale 40)", 2, 8, 13, 3, 40.0)):
        logits = torch.randn(b, length, vocab, generator=g, dtype=torch.float64) * scale      # [b, L, V]
        ids = torch.randint(0, vocab, (b, length), generator=g)                              # [b, L]
        ref = torch.distributions.Categorical(logits=logits[:, prompt_len - 1:-1]).log_prob(ids[:, prompt_len:])
        cases.append((case, (logits.clone(), ids.clone(), prompt_len), ref))                 # [b, L - prompt_len]
    logits = torch.zeros(1, 4, 5, dtype=torch.float64)
    logits[0, 1, 2] = logits[0, 2, 3] = logits[0, 3, 4] = 3.0   # position t favours token t + 1; the response is 2, 3
    ids = torch.tensor([[0, 1, 2, 3]])
    cases.insert(0, ("one position predicts the next: positions 1, 2 favour tokens 2, 3; response [2, 3]", (logits, ids, 2),
                     torch.distributions.Categorical(logits=logits[:, 1:3]).log_prob(ids[:, 2:])))
    n = _run_cases(cases, fn, what="response_logprobs", atol=1e-6, rows="[row, response token]")
    return f"your log-probs match torch.distributions.Categorical on {n} cases: correct"


def check_ppo_clip_loss(fn: Callable, *, seed: int = 0) -> str:
    """``fn(logp, old_logp [b, T], advantages [b], mask [b, T], eps_low, eps_high) -> scalar`` (token mean over the
    mask) against ``rl.algo.ppo_clip``: its value and its gradient, on clipped and unclipped tokens of each sign."""
    import torch

    from brorl_lab.rl import algo

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3             # [4, 6]
    # log-ratios by column: inside both ranges, above 1 + eps_high, below 1 - eps_low, between 1 + eps_low and
    # 1 + eps_high (clip-higher sets these free), and two random ones
    cols = torch.tensor([0.05, 0.5, -0.6, 0.22, 0.0, -0.1], dtype=torch.float64)
    adv_pos, adv_neg = torch.tensor([1.0, 0.7, 1.0, 2.0], dtype=torch.float64), -torch.tensor([1.0, 0.3, 1.0, 2.0],
                                                                                          dtype=torch.float64)
    full = torch.ones(4, 6, dtype=torch.bool)
    padded = full.clone()
    padded[1, 4:] = False
    padded[3, 1:] = False
    cases = [("on-policy: logp == old_logp, A > 0", old, old, adv_pos, full, 0.2, 0.28),
             ("A > 0: ratios inside, above 1 + eps_high, below 1 - eps_low, between 1 + eps_low and 1 + eps_high",
              old + cols, old, adv_pos, full, 0.2, 0.28),
             ("A < 0: the same ratios", old + cols, old, adv_neg, full, 0.2, 0.28),
             ("mixed signs of A, padding masked out (rows 1 and 3)", old + cols, old,
              torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64), padded, 0.2, 0.28),
             ("clip-higher: eps_low 0.1, eps_high 0.4", old + cols, old, adv_pos, full, 0.1, 0.4),
             ("clip-higher, A < 0: eps_low 0.1, eps_high 0.4", old + cols, old, adv_neg, full, 0.1, 0.4)]
    for case, logp, old_logp, adv, mask, lo, hi in cases:
        ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        mine = fn(ours, old_logp.clone(), adv.clone(), mask.clone(), lo, hi)
        ref, _ = algo.ppo_clip(theirs, old_logp, adv, mask, eps_low=lo, eps_high=hi, loss_agg="token_mean")
        mine = _as_tensor(mine, "ppo_clip_loss", case)
        if mine.numel() != 1:
            raise NotYet(f"not yet ({case}): the loss has shape {tuple(mine.shape)}; it must be one number (the mean "
                         "over the real tokens)")
        if not mine.requires_grad:
            raise NotYet(f"not yet ({case}): the loss carries no gradient to logp (detached?)")
        ref.backward()
        (grad,) = torch.autograd.grad(mine.reshape(()), ours, allow_unused=True)
        grad = torch.zeros_like(ours) if grad is None else grad
        if not torch.isclose(mine.detach().reshape(()).double(), ref.detach(), rtol=1e-6, atol=1e-9):
            raise NotYet(f"not yet ({case}): the loss value differs from rl.algo.ppo_clip's (token_mean); "
                         + _ppo_hint(grad, theirs.grad, mask))
        if not torch.allclose(grad.double(), theirs.grad, rtol=1e-6, atol=1e-9):
            raise NotYet(f"not yet ({case}): the value is right but the gradient is not; "
                         + _ppo_hint(grad, theirs.grad, mask))
    return f"your PPO-clip loss matches rl.algo.ppo_clip (value and gradient) on {len(cases)} cases: correct"


def _ppo_hint(grad, ref_grad, mask) -> str:
    """Where a PPO-clip answer goes wrong: tokens with a gradient that should have none (or the reverse), padding."""
    zero, ref_zero = grad.abs() < 1e-12, ref_grad.abs() < 1e-12                # [b, T]
    pad = ~mask
    if (pad & ~zero).any():
        return "padding tokens (mask False) get a gradient"
    if (mask & zero & ~ref_zero).any():
        r, t = (mask & zero & ~ref_zero).nonzero()[0].tolist()
        return f"token [{r}, {t}] is clipped in yours (no gradient) but not in the library's"
    if (mask & ~zero & ref_zero).any():
        r, t = (mask & ~zero & ref_zero).nonzero()[0].tolist()
        return f"token [{r}, {t}] should be clipped (no gradient) but yours passes one"
    return "the clipped tokens agree; look at the sign, the min/max and the mean (over real tokens only)"


def check_kl_estimators(fn: Callable, *, seed: int = 0) -> str:
    """``fn(logp, ref_logp [b, T], kind) -> [b, T]`` for kind 'k1', 'k2', 'k3' against ``rl.algo.kl_k1/k2/k3``, on
    log-ratios d = log pi - log pi_ref of both signs (large, small, zero)."""
    import torch

    from brorl_lab.rl import algo

    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4                            # [3, 5]
    d = torch.tensor([[0.0, 0.3, -0.3, 2.0, -2.0], [1e-3, -1e-3, 0.7, -0.9, 5.0],
                      [-5.0, 0.05, -0.05, 1.5, -1.5]], dtype=torch.float64)                  # [3, 5]
    refs = {"k1": algo.kl_k1, "k2": algo.kl_k2, "k3": algo.kl_k3}
    for kind, ref_fn in refs.items():
        for case, lp, rlp in ((f"{kind}, d = log pi - log pi_ref of both signs", logp, logp - d),
                              (f"{kind}, pi == pi_ref (d = 0)", logp, logp.clone())):
            mine = _as_tensor(fn(lp.clone(), rlp.clone(), kind), "kl_estimate", case)
            ref = ref_fn(lp, rlp)
            if tuple(mine.shape) == tuple(ref.shape):
                off = ~torch.isclose(mine.detach().double(), ref, rtol=1e-6, atol=1e-9)
                if off.any():
                    signs = sorted({"d > 0" if x > 0 else "d < 0" if x < 0 else "d = 0"
                                    for x in (lp - rlp)[off].tolist()})
                    raise NotYet(f"not yet ({case}): {kind} is off on {int(off.sum())} of {off.numel()} tokens, "
                                 f"those with {' and '.join(signs)}")
            _compare(mine, ref, what=f"kl_estimate(..., '{kind}')", case=case, atol=1e-9, rows="[row, token]")
    return "your k1, k2 and k3 match rl.algo.kl_k1/k2/k3 on both signs of the log-ratio: correct"


def spell_backward_cases(count: int = 6, *, seed: int = 0) -> list:
    """(response, item) pairs for checking a spell_backward verifier: exact, padded, upper-case, other words,
    an answer with text after it, an empty response, the answer on a later line, the word itself (not reversed)."""
    from brorl_lab.rollout.tasks import TASKS

    cases = []
    for item in TASKS["spell_backward"].sample(count, seed=seed):
        ans, word = item.answer, item.meta["entry"]["metadata"]["word"]
        cases += [(ans, item), (f"  {ans}\n", item), (ans.upper(), item), (word, item), (ans[:-1], item),
                  (f"{ans} and more", item), ("", item), (f"\n\n{ans}\nthen other text", item), (ans[::-1] + "x", item)]
    return cases


def check_reward(fn: Callable, *, seed: int = 0) -> str:
    """``fn(response: str, item) -> float`` (1.0 right, 0.0 wrong) against the library's verifier
    (``rollout.rewards.score_response(...).correct``) on spell_backward items and edge responses."""
    from brorl_lab.rollout.rewards import score_response

    cases = spell_backward_cases(seed=seed)
    for response, item in cases:
        want = float(score_response(response, item).correct)
        got = fn(response, item)
        if not isinstance(got, (int, float)):
            raise NotYet(f"not yet: the reward of {response!r} is a {type(got).__name__}, not a number")
        if float(got) != want:
            raise NotYet(f"not yet: on the question {item.question!r}, the response {response!r} gets {float(got):g} "
                         f"from yours; the library's verifier says {'correct' if want else 'wrong'}")
    return f"your reward agrees with the library's verifier on {len(cases)} responses: correct"


def check_keep_groups(fn: Callable, *, seed: int = 0) -> str:
    """``fn(correct [P, N] bool) -> [P] bool``: dynamic sampling keeps a group iff it holds a right and a wrong answer
    (``rl.steps.filter_groups``'s rule), on random groups, groups of one, all right, all wrong, one in 512."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cases = [("random groups of 8", torch.rand(10, 8, generator=g) < 0.5),
             ("all right, all wrong, one right, one wrong",
              torch.tensor([[True] * 4, [False] * 4, [True, False, False, False], [True, True, True, False]])),
             ("groups of one", torch.tensor([[True], [False]])),
             ("one right among 512", torch.nn.functional.one_hot(torch.tensor([300]), 512).bool()),
             ("rare successes: groups of 16 at p = 0.05", torch.rand(32, 16, generator=g) < 0.05)]
    for case, correct in cases:
        mine = _as_tensor(fn(correct.clone()), "keep_groups", case)
        ref = correct.any(1) & ~correct.all(1)                                       # [P]
        if tuple(mine.shape) != tuple(ref.shape) or mine.dtype != torch.bool:
            raise NotYet(f"not yet ({case}): keep_groups returned {mine.dtype} of shape {tuple(mine.shape)}; "
                         f"it must be a bool mask of shape {tuple(ref.shape)}, one per group")
        if not torch.equal(mine, ref):
            p = int((mine != ref).nonzero()[0])
            n_right = int(correct[p].sum())
            raise NotYet(f"not yet ({case}): group {p} ({n_right} right of {correct.shape[1]}) is "
                         f"{'kept' if mine[p] else 'dropped'} by yours")
    return f"your filter keeps the groups rl.steps.filter_groups keeps in {len(cases)} cases: correct"
