r"""Math families verified by math-verify: questions from reasoning-gym generators, answers checked symbolically.

The answer is extracted first (``<answer>`` tags, ``\boxed{}``, or the plain first line; see :mod:`.templates`) and
capped at ``MAX_ANSWER_CHARS``, then ``math_verify.verify(parse(reference), parse(answer))`` decides: reward 1 and
correct iff they are mathematically equal (``13``, ``13.0``, ``\frac{26}{2}`` and ``x = 13`` all match ``13``).

math-verify's own timeouts use ``signal.alarm``, which fails outside the main thread (papermill kernels, Ray actors,
thread pools), so it is called with ``parsing_timeout=None`` / ``timeout_seconds=None`` and its run time is bounded
another way: the answer-length cap, plus :func:`too_costly`, which refuses the few short inputs that sympy would
evaluate for ever (power towers such as ``9^9^9``, huge exponents, factorials of big numbers); they score 0.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional

from brorl_lab.rollout.tasks.base import TaskItem, register_task
from brorl_lab.rollout.tasks.gym import GymFamily
from brorl_lab.rollout.tasks.templates import CHAT_BOXED

# name -> (reasoning-gym dataset, difficulty config, description)
MATH_FAMILIES: dict[str, tuple[str, dict, str]] = {
    "simple_equations": ("simple_equations", dict(min_terms=2, max_terms=2, min_value=1, max_value=10),
                         "solve a*x + b = c for x, values 1..10, verified by math-verify"),
}


_POWER = re.compile(r"\^|\*\*")
# A power is cheap when its exponent is a plain integer of at most 2 digits (bare, in braces or in parentheses)
# and it is not itself raised to a power (no towers).
_CHEAP_EXPONENT = re.compile(r"\s*(?:\{\s*[+-]?\d{1,2}\s*\}|\(\s*[+-]?\d{1,2}\s*\)|[+-]?\d{1,2}(?!\d))(?!\s*(?:\^|\*\*))")
_BIG_FACTORIAL = re.compile(r"\d{3,}\s*!|[!)}]\s*!")


def too_costly(answer: str) -> bool:
    """True if sympy could take unbounded time on ``answer``: a power whose exponent is not a plain integer of at
    most 2 digits, a power tower, more than 2 powers, or a factorial of a 3+ digit number or of an expression."""
    powers = list(_POWER.finditer(answer))
    if len(powers) > 2 or any(not _CHEAP_EXPONENT.match(answer, m.end()) for m in powers):
        return True
    return bool(_BIG_FACTORIAL.search(answer))


@lru_cache(maxsize=4096)
def _parse(text: str):
    from math_verify import parse

    return parse(text, parsing_timeout=None)


def math_equal(reference: str, answer: str) -> bool:
    """``True`` iff math-verify finds ``answer`` equal to ``reference`` (both short strings)."""
    from math_verify import verify

    gold, pred = _parse(reference), _parse(answer)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))


class MathVerifyFamily(GymFamily):
    """A reasoning-gym question generator whose answers are checked by math-verify instead of ``score_answer``."""

    chat_instruction = CHAT_BOXED

    def reject(self, answer: str) -> Optional[str]:
        return "answer too costly to verify (see math_tasks.too_costly)" if too_costly(answer) else None

    def verify(self, answer: str, item: TaskItem) -> float:
        return 1.0 if math_equal(item.answer, answer) else 0.0


for _name, (_dataset, _config, _description) in MATH_FAMILIES.items():
    register_task(MathVerifyFamily(_name, _dataset, _config, _description))
