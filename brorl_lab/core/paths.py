"""Where the repository's files are: the one definition of the repository root and its ``data/`` folder."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # brorl_lab/
REPO_ROOT = PACKAGE_DIR.parent  # the checkout: data/, notebooks/, runs/ live here
DATA_DIR = REPO_ROOT / "data"
EVAL_DIR = DATA_DIR / "eval"  # frozen eval sets, one jsonl per task family
DEFAULT_MODEL_DIR = DATA_DIR / "default_model"
PLATEAU_MODEL_DIR = DATA_DIR / "plateau_model"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository root when it lies inside it (for files that get committed), else as is."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
