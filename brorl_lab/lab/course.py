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
