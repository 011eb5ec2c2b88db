"""Run directories: what one run writes, atomically (the readers across runs are in :mod:`brorl_lab.lab.tracking`).

Every run writes into ``runs/<name>/``::

    config.yaml        the validated Config (what `python -m brorl_lab train --config` reads back)
    environment.json   versions, device, threads, host: what the numbers were measured on
    metrics.parquet    one row per step (the DataFrame plots and widgets read)
    events.jsonl       resets, skipped steps, interruptions, failures
    checkpoint/        the last complete checkpoint (see trainer.py)
    tensorboard/, wandb/   tracker files when Config.report_to names them (see rl/trackers.py)
    policy/            the same checkpoint's policy as a Hugging Face model directory (safetensors, tokenizer,
                       generation config): what `AutoModelForCausalLM.from_pretrained`, vLLM and `--model RUN` open
    *.ipynb, *.html, *.png   executed notebooks and figures (papermill runs)

All writes that a crash could tear (metrics, checkpoints, the run index) go through :func:`atomic_write`:
temp file in the same directory, fsync, rename. A reader sees the old file or the new one, never half of one.
Directories (``policy/``) are staged whole beside their target and swapped in by renames (:func:`stage_dir`,
:func:`commit_dir`).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import pandas as pd


def eval_key(key: str) -> Optional[tuple[str, str]]:
    """``"eval/<family>/<metric>"`` -> ``(family, metric)``, else None. A family name may hold ``/`` (a
    ``local:data/qa.jsonl`` task), so the metric is what follows the last ``/``."""
    if not isinstance(key, str) or not key.startswith("eval/") or key.count("/") < 2:
        return None
    family, _, metric = key[len("eval/"):].rpartition("/")
    return family, metric


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask can only read by setting, which races other threads)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def shareable(path: str | os.PathLike, directory: bool = False) -> None:
    """Give a temp file (0600) or temp directory (0700) the mode a plain ``open``/``mkdir`` would have had under the
    user's umask (0644 / 0755 under umask 022), so run outputs are as readable as anything else the user writes."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a temp file, which is fsynced and renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    shareable(tmp)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text), mode="w")


def stage_dir(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Fill a temp directory beside ``path`` with ``write(tmp)`` and fsync its files; returns it. If ``write`` fails
    (a full disk) the temp directory is removed and ``path`` is untouched. Put it in place with :func:`commit_dir`."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    shareable(tmp, directory=True)
    try:
        write(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
                # writers that go through their own temp files leave them 0600 (safetensors' model.safetensors)
                if not f.stat().st_mode & 0o111:
                    shareable(f)
            elif f.is_dir():
                shareable(f, directory=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def commit_dir(staged: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Swap a :func:`stage_dir` directory in for ``path``: old -> ``.NAME.old``, staged -> ``path``, old removed.
    Renames only (no new space needed). A ``.NAME.old`` left by a crash between the two renames is put back first,
    so ``path`` is always either the old directory or the new one."""
    import shutil

    path, staged = Path(path), Path(staged)
    old = path.parent / f".{path.name}.old"
    if old.exists():
        if path.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, path)
    if path.exists():
        os.replace(path, old)
    os.replace(staged, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def atomic_write_dir(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write the directory ``path`` atomically: ``write(tmp)`` fills a staged directory that replaces ``path``."""
    return commit_dir(stage_dir(path, write), path)


def atomic_copy_dir(src: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Copy the directory ``src`` to ``path`` atomically (a policy/ exported or kept as a checkpoint)."""
    import shutil

    return atomic_write_dir(path, lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))


def hf_model_dir(path: str | os.PathLike) -> Optional[Path]:
    """The Hugging Face model directory ``path`` stands for: ``path`` itself when it holds ``config.json``, its
    ``policy/`` when it is a run directory with one (so ``--model runs/NAME`` opens a run's last checkpoint); else
    None."""
    path = Path(path).expanduser()
    for d in (path, path / RunDir.POLICY_DIR):
        if d.is_dir() and (d / "config.json").is_file():
            return d
    return None


def environment_info() -> dict:
    """Versions and hardware, recorded with every run and benchmark."""
    import torch

    info: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    for mod in ("transformers", "vllm", "ray", "reasoning_gym", "math_verify", "papermill", "plotly"):
        info[mod] = _version(mod)
    return info


def _version(module: str) -> Optional[str]:
    from importlib import metadata

    name = {"reasoning_gym": "reasoning-gym", "math_verify": "math-verify"}.get(module, module)
    for dist in (name, f"{name}-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class RunDir:
    """A run directory: config, environment, metrics, events. Cheap to create; safe to re-open for resume."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, root: str | os.PathLike, name: str) -> "RunDir":
        return cls(Path(root) / name)

    #: What a Trainer writes into its run directory; any of them there means the directory holds a run.
    RUN_FILES = ("config.yaml", "metrics.parquet", "events.jsonl", "checkpoint", "policy", "environment.json",
                 "tensorboard", "wandb")
    #: The Hugging Face export of the last checkpoint's policy (written with every checkpoint).
    POLICY_DIR = "policy"

    @classmethod
    def run_files_in(cls, path: str | os.PathLike) -> list[str]:
        """The run files (see RUN_FILES) present in ``path``; does not create ``path``."""
        return [name for name in cls.RUN_FILES if (Path(path) / name).exists()]

    @classmethod
    def holds_run(cls, path: str | os.PathLike) -> bool:
        """Whether ``path`` already holds a Trainer run (config, metrics, events or a checkpoint)."""
        return bool(cls.run_files_in(path))

    @classmethod
    def clear_run(cls, path: str | os.PathLike) -> list[str]:
        """Delete the run files (RUN_FILES) of ``path`` and return their names; other files (an executed notebook,
        a sweep's status.json) stay."""
        import shutil

        removed = cls.run_files_in(path)
        for name in removed:
            target = Path(path) / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        return removed

    # -- files --
    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.parquet"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoint"

    @property
    def policy_dir(self) -> Path:
        return self.path / self.POLICY_DIR

    def write_config(self, config: dict) -> Path:
        import yaml

        return atomic_write_text(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def read_config(self) -> dict:
        from brorl_lab.core.config import read_config_file

        return read_config_file(self.path / "config.yaml")

    def write_environment(self) -> Path:
        return atomic_write_text(self.path / "environment.json", json.dumps(environment_info(), indent=2))

    def write_metrics(self, rows: Iterable[dict]) -> Path:
        df = pd.DataFrame(list(rows))
        return atomic_write(self.metrics_path, lambda f: df.to_parquet(f, index=False))

    def read_metrics(self) -> pd.DataFrame:
        return pd.read_parquet(self.metrics_path) if self.metrics_path.exists() else pd.DataFrame()

    def log_event(self, kind: str, **fields) -> dict:
        """Append one event (reset, skipped step, interrupt, failure) to events.jsonl."""
        event = {"time": time.time(), "event": kind, **fields}
        with open(self.path / "events.jsonl", "a") as f:
            f.write(json.dumps(event, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return event

    def read_events(self) -> list[dict]:
        p = self.path / "events.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line torn by a kill mid-append
                continue
        return out

    def write_status(self, status: str, **fields) -> Path:
        return atomic_write_text(self.path / "status.json", json.dumps({"status": status, **fields}, default=str))

    def read_status(self) -> dict:
        p = self.path / "status.json"
        return json.loads(p.read_text()) if p.exists() else {"status": "unknown"}

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"
