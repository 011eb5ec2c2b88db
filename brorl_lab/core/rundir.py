"""Run directories: what one run writes, atomically (the readers across runs are in :mod:`brorl_lab.lab.tracking`).

Every run writes into ``runs/<name>/``::

    config.yaml        the validated Config (what `python -m brorl_lab train --config` reads back)
    environment.json   versions, device, threads, host: what the numbers were measured on
    metrics.parquet    one row per step (the DataFrame plots and widgets read)
    events.jsonl       resets, skipped steps, interruptions, failures
    status.json        running / finished / interrupted / failed, with the writer's pid, host and a heartbeat
    train.log          one line per step
    checkpoint/        the last complete checkpoint (see trainer.py)
    checkpoints/       kept checkpoints (keep_checkpoints): step_NNNNNN/ with the policy and state.pt
    tensorboard/, wandb/   tracker files when Config.report_to names them (see rl/trackers.py)
    policy/            the same checkpoint's policy as a Hugging Face model directory (safetensors, tokenizer,
                       generation config): what `AutoModelForCausalLM.from_pretrained`, vLLM and `--model RUN` open
    *.ipynb, *.html, *.png   executed notebooks and figures (papermill runs)

All writes that a crash could tear (metrics, checkpoints, the run index) go through :func:`atomic_write`:
temp file in the same directory, fsync, rename. A reader sees the old file or the new one, never half of one.
Directories (``policy/``) are staged whole beside their target and swapped in by renames (:func:`stage_dir`,
:func:`commit_dir`).

One writer at a time: a Trainer holds the directory's lock (:mod:`brorl_lab.core.runlock`, the file
``.<name>.lock`` beside it) while it writes; :meth:`RunDir.read_status` reports a "running" run whose lock is free
(its process died: kill -9, a lost node) as ``interrupted (writer gone)``.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from brorl_lab.core.validation import UserError

if TYPE_CHECKING:  # pandas is imported where a DataFrame is made: the CLI's checks run before it loads
    import pandas as pd

    from brorl_lab.core.config import Config


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


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Check, before any work, that ``path`` (a file or directory a command will write) can be written: a file
    can be created in it (an existing directory) or beside it (in its first existing ancestor, which must be a
    directory). Else one :class:`UserError` naming ``what``, the path and the reason; nothing is written (the
    probe file is removed at once). Returns ``path``."""
    p = Path(path).expanduser().absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe == p and not p.is_dir():
        probe = p.parent  # an existing file is replaced by a rename in its directory
    why = None
    if not probe.is_dir():
        why = f"{probe} is a file, not a directory"
    else:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".brorl-probe-", dir=probe)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            why = f"{e.strerror or type(e).__name__} in {probe}"
    if why:
        raise UserError(f"{what}: cannot write {path} ({why}); allowed: a path in a directory you can write to")
    return Path(path)


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
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno and e.filename is None:  # a writer's own error (pyarrow's): name the
            raise OSError(e.errno, os.strerror(e.errno), str(path)) from e  # file, as the file system's errors do
        raise
    return path


def read_parquet_once(path: str | os.PathLike, **kwargs) -> pd.DataFrame:
    """Read a parquet file that a live run may be replacing (:func:`atomic_write`): its bytes are read through one
    open file, so footer and pages come from the same version. (pyarrow's path reader opens the file more than once;
    a replace in between mixed two versions: "Page was smaller than expected".)"""
    import pandas as pd

    return pd.read_parquet(io.BytesIO(Path(path).read_bytes()), **kwargs)


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


#: What :meth:`RunDir.read_status` says of a run whose status.json says "running" but whose writer is gone.
WRITER_GONE = "interrupted (writer gone)"
#: Seconds between a running Trainer's heartbeats in status.json (besides the write after every step).
HEARTBEAT_S = 30.0


def default_run_name(cfg: Config) -> str:
    """``<tasks>_N<rollouts>_P<prompts>[_lr<lr>][_<advantage>]_s<seed>`` (lr and advantage when they differ from
    the defaults, so two runs that differ only in them get two directories); a ``local:`` task counts by its
    file's stem, and characters a directory name should not hold become ``_`` (one directory under run_dir,
    whatever the task names)."""
    from brorl_lab.core.config import Config

    names = [f"local-{Path(t.partition(':')[2]).stem}" if t.startswith("local:") else t for t in cfg.tasks]
    tasks = re.sub(r"[^A-Za-z0-9_.:+-]", "_", "-".join(names)).lstrip(".")[:120]
    default = Config()
    extra = (f"_lr{cfg.lr:g}" if cfg.lr != default.lr else "") + (
        f"_{cfg.advantage}" if cfg.advantage != default.advantage else "")
    return f"{tasks}_N{cfg.rollouts_per_prompt}_P{cfg.prompts_per_step}{extra}_s{cfg.seed}"


class RunFileError(UserError):
    """A run file that exists but cannot be read (truncated, garbage, not ours): one line naming it."""


def pid_alive(pid: Any) -> Optional[bool]:
    """Whether process ``pid`` exists on this host (None when ``pid`` is not a pid)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDir:
    """A run directory: config, environment, metrics, events. Cheap to create; safe to re-open for resume."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._status: Optional[dict] = None  # the last status this object wrote (what a heartbeat rewrites)
        self._status_guard = threading.Lock()

    @classmethod
    def create(cls, root: str | os.PathLike, name: str) -> "RunDir":
        return cls(Path(root) / name)

    #: What a Trainer writes into its run directory: what ``--overwrite`` moves aside.
    RUN_FILES = ("config.yaml", "metrics.parquet", "events.jsonl", "checkpoint", "checkpoints", "policy",
                 "environment.json", "tensorboard", "wandb", "train.log", "status.json", "report.html",
                 "plotly.min.js")  # the report's plotly.js (lab.report.write_plotlyjs)
    #: Files a papermill run (lab.sweep.run_notebook) owns in a directory whose notebook trains into it.
    NOTEBOOK_FILES = ("parameters.json", "status.json")
    #: The Hugging Face export of the last checkpoint's policy (written with every checkpoint).
    POLICY_DIR = "policy"

    @classmethod
    def run_files_in(cls, path: str | os.PathLike) -> list[str]:
        """The run files (see RUN_FILES) present in ``path``; does not create ``path``."""
        return [name for name in cls.RUN_FILES if (Path(path) / name).exists()]

    @classmethod
    def holds_run(cls, path: str | os.PathLike) -> bool:
        """Whether ``path`` holds a run worth keeping: a checkpoint (the last, a kept one or its policy/), the only
        thing a run continues from. What an attempt stopped before its first checkpoint leaves (config.yaml,
        environment.json, the evaluation before training, metrics of steps no checkpoint holds) is not one: nothing
        can resume it, so the same command runs again in its place (issue 46: no dead end after a second Ctrl-C, a
        ``kill -9`` or an out-of-memory kill before ``checkpoint_every`` steps)."""
        path = Path(path)
        return any((path / name).exists() for name in ("checkpoint", "checkpoints", cls.POLICY_DIR))

    #: Temp files of an atomic write (:func:`atomic_write`, :func:`stage_dir`) a stopped writer left behind.
    TEMP_GLOBS = (".policy.*.tmp", ".metrics.parquet.*.tmp", "checkpoint/.*.tmp", ".policy.old")

    @classmethod
    def remove_stale_temps(cls, path: str | os.PathLike) -> list[str]:
        """Remove the temp files and staged directories a killed or failed write left in ``path`` (a full disk
        mid-checkpoint: ``.policy.*.tmp``); only for the holder of the run's lock. Returns their names. A
        ``.policy.old`` whose ``policy/`` is missing (a crash between :func:`commit_dir`'s renames) is put back."""
        import shutil

        path, removed = Path(path), []
        for pattern in cls.TEMP_GLOBS:
            for stale in sorted(path.glob(pattern)):
                if stale.name.endswith(".old") and not (stale.parent / stale.name[1:-4]).exists():
                    os.replace(stale, stale.parent / stale.name[1:-4])
                    continue
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
                removed.append(str(stale.relative_to(path)))
        return removed

    @classmethod
    def clear_run(cls, path: str | os.PathLike, keep: Iterable[str] = ()) -> list[str]:
        """Move every entry of ``path`` but ``keep`` aside, then delete them; return their names. Each move is one
        rename into ``.overwritten-*/`` inside ``path``, all done before the new run writes anything, so the new run
        never shares the directory with a file of the old one (a kill between the moves leaves the rest in place,
        and the next overwrite moves them)."""
        import shutil

        path = Path(path)
        if not path.is_dir():
            return []
        keep = set(keep)
        names = sorted(e.name for e in path.iterdir() if e.name not in keep)
        trash_dirs = [path / n for n in names if n.startswith(".overwritten-")]
        names = [n for n in names if not n.startswith(".overwritten-")]
        if names:
            trash = Path(tempfile.mkdtemp(prefix=".overwritten-", dir=path))
            for name in names:
                os.replace(path / name, trash / name)
            trash_dirs.append(trash)
        for t in trash_dirs:
            shutil.rmtree(t, ignore_errors=True)
        return names

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
        import pandas as pd

        df = pd.DataFrame(list(rows))
        return atomic_write(self.metrics_path, lambda f: df.to_parquet(f, index=False))

    def read_metrics(self) -> pd.DataFrame:
        """The metrics table (empty when there is none); a file that is not a readable parquet table is one
        :class:`RunFileError` naming it."""
        if not self.metrics_path.exists():
            import pandas as pd

            return pd.DataFrame()
        try:
            return read_parquet_once(self.metrics_path)
        except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError, ...: one line naming the file
            raise RunFileError(f"run_dir: {self.metrics_path} could not be read ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]}); allowed: a metrics file written by train "
                               "(`train --resume` rebuilds it from the checkpoint)") from None

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
        """status.json: ``status`` and ``fields``, with the writer's pid and host and a heartbeat (the time)."""
        record = {"status": status, **fields, "pid": os.getpid(), "host": socket.gethostname()}
        with self._status_guard:
            self._status = record
            return self._write_status_file(record)

    def _write_status_file(self, record: dict) -> Path:
        return atomic_write_text(self.path / "status.json", json.dumps({**record, "heartbeat": time.time()},
                                                                       default=str))

    def heartbeat(self) -> None:
        """Rewrite the last status this object wrote with a new heartbeat (while it says "running")."""
        with self._status_guard:
            if self._status is not None and self._status.get("status") == "running":
                self._write_status_file(self._status)

    def read_status(self) -> dict:
        """status.json as written, except that "running" becomes :data:`WRITER_GONE` when the writer is gone: its
        lock is free (:func:`brorl_lab.core.runlock.writer_alive`) or, with no lock file to ask, its pid is not
        alive on this host. ``{"status": "unknown"}`` when there is none, ``"unreadable"`` for a damaged one."""
        from brorl_lab.core.runlock import writer_alive

        p = self.path / "status.json"
        if not p.exists():
            return {"status": "unknown"}
        try:
            st = json.loads(p.read_text())
            if not isinstance(st, dict):
                raise ValueError(f"a JSON {type(st).__name__}")
        except (OSError, ValueError) as e:
            return {"status": "unreadable", "error": f"status.json: {type(e).__name__}: {e}"}
        if st.get("status") == "running":
            alive = writer_alive(self.path)
            if alive is None and st.get("host") == socket.gethostname():
                alive = pid_alive(st.get("pid"))
            if alive is False:
                st = {**st, "status": WRITER_GONE, "recorded_status": "running"}
        return st

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"
