"""One writer per run directory: an OS-level lock (``fcntl.flock``) on a small file beside the directory.

    with RunLock.acquire("runs/a"):     # runs/.a.lock, held exclusively while the run is written
        ...

Why beside and not inside: ``--overwrite`` may move the whole old directory aside, and the lock must stay where it
is while that happens. The lock file holds who took it (pid, host, start time, command) as one JSON line, so a
second writer is refused in one line naming the holder. The kernel drops an ``flock`` when its process dies (kill -9
included), so a lock file whose record is still there but whose lock is free was left by a writer that is gone:
the next writer takes it over and says so (:attr:`RunLock.took_over`). A clean release empties the record.

Readers ask :func:`writer_alive` whether a status.json that says "running" still has its writer.

Limits: ``flock`` is per host on network file systems (NFS clients may not see each other's locks); two writers
on different hosts sharing one NFS run directory are not told apart by it. The status file's host field says
which host last wrote.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from brorl_lab.core.validation import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; the record file alone (best effort)
    fcntl = None  # type: ignore[assignment]

#: Lock kinds and their file suffixes: a Trainer (or export) writing a run, a papermill run of a notebook into a
#: directory, a sweep writing its index.
KINDS = {"run": ".lock", "notebook": ".notebook.lock", "sweep": ".sweep.lock"}

# Locks this process holds, by lock file: a second Trainer in the same process (a notebook cell run again) may take
# over from an idle one but never from one that is inside run().
_held: dict[str, "RunLock"] = {}
_held_guard = threading.RLock()


class RunLockedError(UserError):
    """The run directory is being written by another live process (or another busy Trainer in this one)."""


def lock_path(path: str | os.PathLike, kind: str = "run") -> Path:
    path = Path(path).absolute()
    return path.parent / f".{path.name}{KINDS[kind]}"


def holder_text(record: dict) -> str:
    """``pid 123 on host h since 2026-12-06 01:02:03 UTC (python -m brorl_lab train ...)``."""
    started = record.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    command = f" ({record['command']})" if record.get("command") else ""
    return f"pid {record.get('pid', '?')} on host {record.get('host', '?')} since {when}{command}"


def _read_record(f) -> dict:
    try:
        f.seek(0)
        text = f.read().strip()
        record = json.loads(text) if text else {}
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _command() -> str:
    argv = sys.argv
    if argv and argv[0].endswith(("__main__.py", "brorl_lab")):
        argv = ["python -m brorl_lab", *argv[1:]]
    return " ".join(argv)[:300]


class RunLock:
    """An exclusive ``flock`` on ``.<name>.lock`` beside a run directory (see the module docstring)."""

    def __init__(self, path: Path, kind: str, f, record: dict, took_over: Optional[dict]):
        self.path, self.kind, self._f, self.record, self.took_over = path, kind, f, record, took_over
        self.busy = False  # set by a Trainer while it is inside run(): this process then refuses a second writer

    @classmethod
    def acquire(cls, directory: str | os.PathLike, kind: str = "run", *, what: str = "run_dir",
                wait_s: float = 0.5) -> "RunLock":
        """Take the lock of ``directory`` or raise :class:`RunLockedError` naming the holder. A lock left by a dead
        process is taken over (``took_over`` holds its record). ``wait_s``: how long a contended lock is retried
        (a reader probing it with :func:`writer_alive` holds it for microseconds)."""
        lp = lock_path(directory, kind)
        key = str(lp)
        with _held_guard:
            mine = _held.get(key)
            if mine is not None:  # this process holds it through another object
                if mine.busy:
                    raise RunLockedError(f"{what}: {directory} is being written in this process "
                                         f"({holder_text(mine.record)}); allowed: stop it (trainer.stop()) and wait, "
                                         "or another run_name / directory")
                mine.release()  # an idle Trainer of an earlier cell: the new one takes over
        lp.parent.mkdir(parents=True, exist_ok=True)
        f = open(lp, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if fcntl is not None:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                record = _read_record(f)
                f.close()
                raise RunLockedError(f"{what}: {directory} is being written by {holder_text(record)}; allowed: wait "
                                     "for it to finish, stop it (Ctrl-C or kill PID: it checkpoints), or another "
                                     "run_name / directory") from None
        previous = _read_record(f)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": _command()}
        f.seek(0)
        f.truncate()
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
        lock = cls(lp, kind, f, record, previous or None)
        with _held_guard:
            _held[key] = lock
        return lock

    @property
    def held(self) -> bool:
        return self._f is not None

    def notice(self, directory: str | os.PathLike) -> Optional[str]:
        """The line to show when this lock was taken over from a writer that is gone, else None."""
        if not self.took_over:
            return None
        return (f"notice: {directory}: its last writer ({holder_text(self.took_over)}) is gone without releasing "
                "the run; taking over")

    def release(self) -> None:
        """Empty the record and drop the lock (idempotent)."""
        f, self._f = self._f, None
        if f is None:
            return
        with _held_guard:
            if _held.get(str(self.path)) is self:
                del _held[str(self.path)]
        try:
            f.seek(0)
            f.truncate()
            f.flush()
        except OSError:
            pass
        finally:
            f.close()  # closing the descriptor drops the flock

    def __enter__(self) -> "RunLock":
        self.busy = True  # held for a block of work (a sweep, a papermill run, an export): never handed over
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # a Trainer never closed: the lock goes with it
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def lock_held(directory: str | os.PathLike, kind: str = "run") -> Optional[bool]:
    """Whether the ``kind`` lock of ``directory`` is held by a live process (this one included); None when it has
    no lock file."""
    lp = lock_path(directory, kind)
    with _held_guard:
        if str(lp) in _held:
            return True
    try:
        f = open(lp)  # noqa: SIM115
    except OSError:
        return None
    try:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        f.close()  # drops the probe's shared lock at once
    return False


def writer_alive(directory: str | os.PathLike) -> Optional[bool]:
    """Whether a writer (a Trainer, an export, a papermill run) holds a lock of ``directory``: True, False when
    lock files exist and none is held (its writer is gone), None when there is no lock file (an old run, or a
    directory copied from elsewhere: nothing to tell)."""
    held = [lock_held(directory, kind) for kind in ("run", "notebook")]
    if any(held):
        return True
    return None if all(h is None for h in held) else False
