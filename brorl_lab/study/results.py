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

Pre-registration (issue 42), enforced by code. A run of a study (:mod:`brorl_lab.study.runner`) takes its start
(:func:`start_of_run`) before any arm runs and adds three keys to every provenance record it writes
(:data:`SHIPPED_KEYS` = :data:`PROVENANCE_KEYS` + these)::

    started_at  when the run started (UTC, "%Y-%m-%dT%H:%M:%SZ"), taken before any arm ran   "2026-12-07T03:10:00Z"
    commit      (as above) taken at that same start, not when the run ends
    declaration {"path": repo path of the study's declaration.json, "commit": the commit that added it (short
                hash)} for a run meant for shipped results; {"path": ..., "commit": null} or null for an
                exploratory run (no declaration committed)

The declaration (:func:`write_declaration`, ``<out>/declaration.json``) is the study as declared before the run:
its design (branch point, arms with N and prompts per step, budget, grid), seeds, the reading (the function's
dotted name) and its thresholds. A run meant for shipped results (a full-size preset, or ``ship=True`` / ``--ship``)
calls :func:`require_preregistered` first: it refuses to start (a :class:`~brorl_lab.core.validation.UserError`:
one line, exit 2 on the CLI, saying what to commit) while the declaration is missing, differs from the one
committed, or the tracked tree has uncommitted changes. Exploratory runs stay free: they record the commit with
``-dirty`` when the tree had changes, and ``declaration`` without a commit; a shipped page must not be built from
such a record (:func:`is_shippable` says which records qualify: a clean commit, a start time, a committed
declaration whose commit is an ancestor of the run's commit).
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
SHIPPED_KEYS = PROVENANCE_KEYS + ("started_at", "declaration")  # what a record for shipped results carries
SUFFIX = ".provenance.json"
DECLARATION = "declaration.json"  # a study's declaration, in its output folder


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


def publish(out: str | Path, figures: str | Path, names: Mapping[str, str], record: Mapping) -> list[Path]:
    """A run's results files into ``figures`` (the shipped notebooks/figures) under their shipped names (``names``:
    {file in ``out``: its name in ``figures``}; a file the run did not write is skipped), each with ``record``
    beside it: what a study command's ``--figures`` writes, so that no shipped results file is copied by hand.
    Returns every path written."""
    import shutil

    out, figures = Path(out), Path(figures)
    figures.mkdir(parents=True, exist_ok=True)
    done = []
    for src, name in names.items():
        if (out / src).is_file():
            done += [Path(shutil.copyfile(out / src, figures / name)), write_provenance(figures / name, record)]
    return done


def read_provenance(results_file: str | Path) -> dict:
    """The provenance record of ``results_file``: its sidecar, or the ``"provenance"`` key of a JSON file."""
    side = provenance_path(results_file)
    if side.is_file():
        return json.loads(side.read_text())
    if Path(results_file).suffix == ".json":
        return json.loads(Path(results_file).read_text()).get("provenance", {})
    return {}


# ---- pre-registration (module docstring) -------------------------------------------------------------------------------
def _git(args: list[str], cwd: Path) -> Optional[str]:
    """``git <args>``'s stdout in ``cwd`` (stripped), or None when git fails or is missing."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def start_of_run(cwd: Optional[Path] = None) -> dict:
    """What a run records when it starts: ``started_at`` (UTC now) and ``commit`` (:func:`git_commit`, now)."""
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit(cwd)}


def write_declaration(out: str | Path, declaration: Mapping) -> Path:
    """Write a study's ``declaration`` (design, budgets, seeds, reading and thresholds: plain JSON data) to
    ``out/declaration.json``, sorted keys and a final newline, so the same study always writes the same bytes.
    An identical file is left untouched (its commit stays valid)."""
    from brorl_lab.core.rundir import atomic_write_text

    path = Path(out) / DECLARATION
    text = json.dumps(dict(declaration), indent=1, sort_keys=True, default=str) + "\n"
    if not (path.is_file() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def declaration_commit(path: str | Path) -> Optional[str]:
    """The commit (short hash) that last changed the committed ``path``, or None when it is not committed as it is
    on disk (untracked, changed since, or outside a git checkout)."""
    path = Path(path).resolve()
    cwd = path.parent if path.parent.is_dir() else Path(__file__).resolve().parent
    if _git(["ls-files", "--error-unmatch", path.name], cwd) is None:
        return None
    if _git(["diff", "--quiet", "HEAD", "--", path.name], cwd) is None:  # exit 1: differs from HEAD
        return None
    return _git(["log", "-n", "1", "--format=%h", "--", path.name], cwd) or None


def declaration_record(path: str | Path) -> dict:
    """The provenance's ``declaration`` key: its repository path and the commit that holds it (None: not committed)."""
    p = Path(path)
    return {"path": repo_relative(p) if p.exists() else str(p), "commit": declaration_commit(p)}


def require_preregistered(declaration: str | Path) -> dict:
    """Refuse (a UserError: one line) to start a run meant for shipped results unless ``declaration`` is committed
    as it is and the tracked tree is clean. Returns :func:`declaration_record` when it may start."""
    from brorl_lab.core.validation import UserError

    path = Path(declaration)
    shown = repo_relative(path) if path.exists() else str(path)
    rec = declaration_record(path)
    if rec["commit"] is None:
        raise UserError(f"declaration: {shown} is not committed as written; allowed: commit it first "
                        f"(git add -f {shown} && git commit -m 'declare <study>'), then run the same command again")
    dirty = git_commit(path.parent)
    if dirty.endswith("-dirty"):
        changed = _git(["status", "--porcelain", "--untracked-files=no"], path.parent) or ""
        files = ", ".join(line.split(maxsplit=1)[-1] for line in changed.splitlines()[:4])
        raise UserError(f"tree: uncommitted changes ({files}{', ...' if len(changed.splitlines()) > 4 else ''}); "
                        "allowed: a clean tree for a shipped run: commit or set aside those changes, then run again")
    return rec


def is_shippable(record: Mapping) -> list[str]:
    """Why a provenance ``record`` cannot back a shipped page ([] when it can): a commit without "-dirty", a
    ``started_at``, and a ``declaration`` with a commit that is an ancestor of (or is) the run's commit."""
    why = [f"missing {k}" for k in SHIPPED_KEYS if k not in record]
    commit = str(record.get("commit", ""))
    if not commit or commit == "unknown" or commit.endswith("-dirty"):
        why.append(f"commit {commit!r} is not a clean commit")
    decl = record.get("declaration") or {}
    if not decl.get("commit"):
        why.append("no committed declaration")
    elif not why and _git(["merge-base", "--is-ancestor", decl["commit"], commit],
                          Path(__file__).resolve().parent) is None:
        why.append(f"declaration commit {decl['commit']} is not an ancestor of the run's commit {commit}")
    return why


def _untrusted(record: Path, into: Path, known: dict[str, bool]) -> Optional[str]:
    """Why ``record`` cannot back a shipped file in the checkout ``into`` (None: it can): not JSON, a key of
    :data:`SHIPPED_KEYS` missing, or a commit that is dirty or not in ``into``'s history (``known`` caches each
    commit's answer)."""
    try:
        prov = json.loads(record.read_text())
    except ValueError:
        return "its provenance record is not JSON"
    missing = [k for k in SHIPPED_KEYS if k not in prov]
    if missing:
        return f"its record lacks {missing}"
    commit = str(prov.get("commit", ""))
    if commit not in known:
        known[commit] = bool(commit) and not commit.endswith("-dirty") and subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=into, capture_output=True).returncode == 0
    return None if known[commit] else f"commit {commit!r} is dirty or not in this history"


def adopt(source: str | Path, into: str | Path, *, under: str = "notebooks/figures", dry_run: bool = False) -> dict:
    """Bring a study clone's finished results into this checkout: every results file the clone wrote under
    ``source/under`` (new or changed against its own commit) that has a shipped provenance record beside it
    (:data:`SHIPPED_KEYS`) is copied with its record into the same place in ``into`` when ``into`` has neither.
    What the repository history needs to trust it is checked first (:func:`_untrusted`): the record names a clean
    commit (no ``-dirty``) that ``into``'s git history holds, a start and a declaration. A file already there
    with the same bytes is counted as ``same``; one there with other bytes is a ``conflict`` and left untouched
    (nothing already written is lost). Returns {"adopted", "same", "conflicts", "refused": [relative paths, a
    refusal with its reason]}; ``dry_run`` copies nothing. Then ``python -m brorl_lab render`` and a commit ship
    them: the way a long study run from a clean clone reaches ``main``, one finished arm x seed at a time."""
    import filecmp
    import shutil

    source, into = Path(source).resolve(), Path(into).resolve()
    if not (source / under).is_dir():
        raise ValueError(f"source: {str(source)!r} has no {under}/; allowed: a checkout of this repository "
                         "(a study clone) that ran a study")
    # what the clone wrote: its files under ``under`` that its own commit does not hold (new or changed)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", under], cwd=source,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    written = {source / line[3:].strip('"') for line in status}
    out: dict[str, list[str]] = {"adopted": [], "same": [], "conflicts": [], "refused": []}
    known: dict[str, bool] = {}
    for record in sorted(p for p in (source / under).rglob(f"*{SUFFIX}") if p in written):
        data = record.with_name(record.name[: -len(SUFFIX)])
        rel = data.relative_to(source)
        if not data.is_file():
            continue
        pair = [(data, into / rel), (record, into / rel.with_name(record.name))]
        there = [dst.is_file() and filecmp.cmp(src, dst, shallow=False) for src, dst in pair]
        if all(there):
            out["same"].append(str(rel))
            continue
        why = _untrusted(record, into, known)
        if why:
            out["refused"].append(f"{rel}: {why}")
            continue
        # the data first: a record never stands beside a missing file (a copy stopped between the two leaves the
        # data alone, and the next adopt finishes it)
        todo = [(src, dst) for (src, dst), ok in zip(pair, there) if not ok]
        if any(dst.exists() for _, dst in todo):
            out["conflicts"].append(str(rel))
            continue
        out["adopted"].append(str(rel))
        if not dry_run:
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            for src, dst in todo:
                shutil.copyfile(src, dst)
    return out
