"""The checks every public function repeats, written once: each raises one ``ValueError`` that names the argument,
the value and what is allowed (``"samples: got 0; allowed: an integer >= 1"``). ``bool`` is never a number here:
``True`` passed as a count is a mistake, though Python's ``bool`` subclasses ``int``."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np


class UserError(ValueError):
    """Bad input the user gave (a flag, a config field, a path, a run directory), in one line naming it and what is
    allowed. The CLI prints these as that one line; every other exception is a bug and keeps its traceback."""


class ConfigError(UserError):
    """A config field has a value outside what is allowed. The message names field, value and the allowed set.
    (Defined here, below :mod:`brorl_lab.core.config` and :mod:`brorl_lab.core.trl_names`, which both raise it.)"""


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """A real number (Python or numpy int/float), not a bool; may be nan or inf."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def is_finite_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def check_int(name: str, value: Any, low: int = 1) -> int:
    """``value`` if it is an integer >= ``low``, else ``ValueError("<name>: got <value>; allowed: an integer >= low")``."""
    if not is_int(value) or value < low:
        raise UserError(f"{name}: got {value!r}; allowed: an integer >= {low}")  # a ValueError
    return int(value)


def did_you_mean(value: Any, allowed: Iterable[Any]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``allowed`` to ``value``, or ``""`` when none is close."""
    near = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def check_seeds(seeds: Any) -> list[int]:
    """``seeds`` as a list, or one ValueError naming ``seeds``: a non-empty iterable of distinct integers >= 0."""
    out = list(seeds) if isinstance(seeds, Iterable) and not isinstance(seeds, (str, bytes)) else []
    if not out or any(not is_int(s) or s < 0 for s in out) or len(set(out)) < len(out):
        raise UserError(f"seeds: got {seeds!r}; allowed: a non-empty list of distinct integers >= 0")
    return out
