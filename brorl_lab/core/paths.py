"""Where brorl_lab's files are: the one definition of the shipped data, the checkout, and the user cache.

The shipped data (the default model, the plateau model and the frozen eval sets) lives in ``data/`` at the top of
the checkout, and a built wheel carries the same folder as package data, ``brorl_lab/_data/`` (pyproject's
``[tool.setuptools]`` maps ``data/`` there). :data:`DATA_DIR` is whichever exists: the wheel's copy, found through
``importlib.resources`` so an installed package never needs a checkout, else the checkout's ``data/`` (an
editable install or ``PYTHONPATH`` on a checkout). The checkout-only folder ``notebooks/`` stays relative to
:data:`REPO_ROOT`; :data:`RUNS_DIR` is the checkout's ``runs/``, or ``./runs`` for an installed package.

Eval sets that brorl_lab generates for user-named tasks (``rg:<dataset>``, ``local:<file>``) are not package
data: they go to :func:`cache_dir` (``$BRORL_LAB_CACHE``, else ``$XDG_CACHE_HOME/brorl_lab``, else
``~/.cache/brorl_lab``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # brorl_lab/
REPO_ROOT = PACKAGE_DIR.parent  # the checkout: data/, notebooks/, runs/ live here
PACKAGED_DATA = "_data"  # the name data/ gets inside an installed wheel (pyproject.toml maps it)


def _data_dir() -> Path:
    """The wheel's ``brorl_lab/_data`` when installed from a wheel, else the checkout's ``data/``."""
    packaged = resources.files("brorl_lab") / PACKAGED_DATA
    if packaged.is_dir():
        return Path(str(packaged))  # wheels install as plain files, so the Traversable is a real directory
    return REPO_ROOT / "data"


DATA_DIR = _data_dir()
EVAL_DIR = DATA_DIR / "eval"  # frozen eval sets, one jsonl per task family
DEFAULT_MODEL_DIR = DATA_DIR / "default_model"
PLATEAU_MODEL_DIR = DATA_DIR / "plateau_model"  # the products_2d floor (alias 'floor', also 'plateau')
LEARNED_PLATEAU_DIR = DATA_DIR / "learned_plateau"  # ProRL v2 raised it, then it stalled (alias 'learned')
TAKEOFF_BASE_DIR = DATA_DIR / "takeoff_base"  # a 400-step train-default: rare successes before learning ('takeoff')
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and NOTEBOOK_DIR.is_dir()
# Default parent of the experiments' run directories: the checkout's runs/, or ./runs for an installed package
# (never site-packages).
RUNS_DIR = REPO_ROOT / "runs" if IN_CHECKOUT else Path("runs")


def cache_dir() -> Path:
    """The user cache for generated files (eval sets of ``rg:`` and ``local:`` tasks); read from the environment
    on every call, so a test or a sweep can point it elsewhere with ``BRORL_LAB_CACHE``."""
    if os.environ.get("BRORL_LAB_CACHE"):
        return Path(os.environ["BRORL_LAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "brorl_lab"


def looks_local(model: str) -> bool:
    """Whether a model string names a local path rather than a hub id, so a typo'd path fails at once instead of
    reaching the hub (where it retries for ~20 s). Hub ids are ``name`` or ``org/name``; a string is local when it
    starts with ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, exists on disk, or its first path
    component is ``runs`` or an existing directory (``runs/my_run``, ``checkpoints/x``)."""
    if model.startswith((".", "/", "~")) or "\\" in model or model.count("/") > 1 or Path(model).exists():
        return True
    head = model.split("/", 1)[0]
    return "/" in model and (head == "runs" or Path(head).is_dir())


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository root when it lies inside it (for files that get committed), else as is."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
