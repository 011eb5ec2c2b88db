"""Where a study's numbers come from: the provenance record shipped beside every results file.

Every number the README and docs/ quote about a study is read from a results file in the repository
(docs/results/*.md name theirs; tests/test_results_numbers.py checks each quoted number against them). Each results
file ``X`` has a provenance record ``X.provenance.json`` (or, for a JSON results file, a ``"provenance"`` key)
with the keys of :data:`PROVENANCE_KEYS`::

    command     the command as typed, from the repository root   "python -m brorl_lab theorem --threads 1"
    commit      git commit of the code that ran (+ "-dirty" when the tree had uncommitted changes)
    checkpoints {name: {"path": ..., "sha256": sha256 of its model.safetensors}} the run started from
    machine     where it ran (CPU, cores, torch threads, load average at the start), in words or as a dict
    wall_s      wall time of the command in seconds
    date        when it ran (UTC)

:func:`provenance` builds one at the end of a run; :func:`write_provenance` writes it beside its file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from brorl_lab.core.paths import DEFAULT_MODEL_DIR, repo_relative

PROVENANCE_KEYS = ("command", "commit", "checkpoints", "machine", "wall_s", "date")
SUFFIX = ".provenance.json"


def git_commit(cwd: Optional[Path] = None) -> str:
    """The checked-out commit (short hash, "-dirty" when tracked files have uncommitted changes), or "unknown"
    outside a git checkout."""
    cwd = Path(cwd or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def checkpoint_sha256(model_dir: str | Path) -> Optional[str]:
    """sha256 of ``model_dir/model.safetensors`` (None when the directory holds none, e.g. a hub id)."""
    weights = Path(model_dir) / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None


def machine_info() -> dict:
    """CPU model, cores, torch threads and the load average now: what a reader needs to weigh a wall time."""
    from brorl_lab.core.rundir import environment_info

    env = environment_info()
    keep = ("cpu", "cpu_count", "torch_threads", "device", "platform", "torch")
    return {**{k: env[k] for k in keep}, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def provenance(command: str, checkpoints: Mapping[str, str | Path], wall_s: float, *, commit: Optional[str] = None,
               **extra) -> dict:
    """A provenance record (module docstring) for a run of ``command`` from ``checkpoints`` ({name: model dir})
    that took ``wall_s`` seconds; ``commit`` is the code's commit taken when the run *started* (default: now);
    ``extra`` keys are kept as given (settings worth reading beside the numbers)."""
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"command: got {command!r}; allowed: the command as typed, e.g. 'python -m brorl_lab ...'")
    dirs = {name: DEFAULT_MODEL_DIR if str(p) == "default" else Path(p) for name, p in checkpoints.items()}
    cks = {name: {"path": repo_relative(p) if p.exists() else str(p), "sha256": checkpoint_sha256(p)}
           for name, p in dirs.items()}
    return {"command": command, "commit": commit or git_commit(), "checkpoints": cks, "machine": machine_info(),
            "wall_s": round(float(wall_s), 1), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def provenance_path(results_file: str | Path) -> Path:
    """Where ``results_file``'s provenance record lives: ``<results_file>.provenance.json``."""
    p = Path(results_file)
    return p.with_name(p.name + SUFFIX)


def write_provenance(results_file: str | Path, record: Mapping) -> Path:
    """Write ``record`` beside ``results_file`` (:func:`provenance_path`)."""
    from brorl_lab.core.rundir import atomic_write_text

    missing = [k for k in PROVENANCE_KEYS if k not in record]
    if missing:
        raise ValueError(f"record: missing {missing}; allowed: a dict with keys {', '.join(PROVENANCE_KEYS)}")
    return atomic_write_text(provenance_path(results_file), json.dumps(dict(record), indent=1, default=str) + "\n")


def read_provenance(results_file: str | Path) -> dict:
    """The provenance record of ``results_file``: its sidecar, or the ``"provenance"`` key of a JSON file."""
    side = provenance_path(results_file)
    if side.is_file():
        return json.loads(side.read_text())
    if Path(results_file).suffix == ".json":
        return json.loads(Path(results_file).read_text()).get("provenance", {})
    return {}
