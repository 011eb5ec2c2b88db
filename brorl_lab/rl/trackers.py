"""Trackers: the Trainer's metrics rows also go to TensorBoard or W&B, as callbacks (``Config.report_to``).

    cfg = Config(report_to=["tensorboard", "wandb"])     # names from TRACKERS
    tensorboard --logdir runs                            # every run's <run>/tensorboard/ event files
    python -m brorl_lab tensorboard runs/*               # events for runs trained before (from metrics.parquet)

Each tracker logs every numeric value of a metrics row (the columns of metrics.parquet, same names; TensorBoard's
tag alphabet turns ``eval/gcd/pass@1`` into ``eval/gcd/pass_1``, see :func:`tensorboard_tag`) at the row's ``step``.
'tensorboard' writes event files with tensorboardX (no TensorFlow, no tensorboard server needed to write);
'wandb' writes an offline W&B run under ``<run>/wandb/`` (no account, no network: ``wandb sync`` uploads it later).
:func:`read_tensorboard` and :func:`read_wandb` read those files back into a DataFrame (what the tests check and a
notebook can plot), so a run's trackers can be compared with its parquet.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import struct
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from brorl_lab.core.validation import UserError
from brorl_lab.rl.names import TRACKERS  # declared there (names only, no pandas); registered below

TENSORBOARD_DIR = "tensorboard"  # inside a run directory
WANDB_DIR = "wandb"


def scalars(row: dict) -> dict[str, float]:
    """The values of a metrics row a tracker logs: finite numbers (booleans as 0/1), ``step`` excluded."""
    out = {}
    for k, v in row.items():
        if k == "step" or isinstance(v, str) or v is None:
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[k] = f
    return out


class Tracker:
    """A Trainer callback ``tracker(trainer, row)`` that logs ``row`` at ``row['step']``.

    ``first_step`` is the first step this process logs: a resumed run starts after its checkpoint, and TensorBoard
    then drops the events a crashed process had logged past that step (they are logged again).
    """

    name = ""
    requires = ""  # the module it writes with, and the pip requirement that brings it

    def __init__(self, run_dir: str | Path, config: dict, *, first_step: int = 0):
        self.run_dir, self.config, self.first_step = Path(run_dir), config, first_step

    def __call__(self, trainer: Any, row: dict) -> None:
        self.log(row)

    def log(self, row: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """Event files in ``<run>/tensorboard/`` (tensorboardX), flushed after every row so a live TensorBoard sees it."""

    name = "tensorboard"
    requires = ("tensorboardX", "tensorboardX")

    def __init__(self, run_dir, config, *, first_step=0):
        super().__init__(run_dir, config, first_step=first_step)
        self.writer = tensorboard_writer(self.run_dir / TENSORBOARD_DIR, purge_step=first_step or None)
        if not first_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def log(self, row: dict) -> None:
        write_scalars(self.writer, [row])

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """An offline W&B run in ``<run>/wandb/`` (``WANDB_MODE`` overrides 'offline'), named after the run directory,
    with the config as its config; ``wandb sync <run>/wandb/offline-run-*`` uploads it."""

    name = "wandb"
    requires = ("wandb", "brorl_lab[track]")

    def __init__(self, run_dir, config, *, first_step=0):
        super().__init__(run_dir, config, first_step=first_step)
        import wandb

        self.run = wandb.init(mode=os.environ.get("WANDB_MODE", "offline"), dir=str(self.run_dir),
                              project=os.environ.get("WANDB_PROJECT", "brorl_lab"), name=self.run_dir.name,
                              config=config, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))

    def log(self, row: dict) -> None:
        self.run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def check_trackers(names: Sequence[str]) -> None:
    """One ConfigError for a tracker whose package is not installed, before a model is loaded or a run started."""
    import importlib.util

    from brorl_lab.core.config import ConfigError

    for n in names:
        module, requirement = TRACKERS.get(n).requires
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"config field 'report_to': {n!r} needs the {module} package, which is not installed; "
                              f"allowed: pip install '{requirement}', or leave {n!r} out")


def make_trackers(names: Sequence[str], run_dir: str | Path, config: dict, *, first_step: int = 0) -> list[Tracker]:
    return [TRACKERS.get(n)(run_dir, config, first_step=first_step) for n in names]


# ---- TensorBoard files: write from parquet, read back ----------------------------------------------------------------
def tensorboard_writer(logdir: str | Path, purge_step: Optional[int] = None):
    from tensorboardX import SummaryWriter

    # The file name is events.out.tfevents.<unix second>.<host><suffix>: a resumed run that starts within the second
    # its crashed process started would reopen, and truncate, that process's file without a suffix of its own.
    suffix = f".{os.getpid()}.{time.time_ns()}"
    return SummaryWriter(logdir=str(logdir), purge_step=purge_step, flush_secs=30, filename_suffix=suffix)


def tensorboard_tag(name: str) -> str:
    """The TensorBoard tag of a metrics column: characters outside ``[A-Za-z0-9_./-]`` become ``_`` (what
    TensorBoard accepts; tensorboardX would do the same, with a log line per tag)."""
    return re.sub(r"[^-/\w.]", "_", name).lstrip("/")


def write_scalars(writer, rows: Iterable[dict]) -> int:
    """Log each row's :func:`scalars` at its step; returns the number of values written."""
    n = 0
    for row in rows:
        step = int(row["step"])
        for k, v in scalars(row).items():
            writer.add_scalar(tensorboard_tag(k), v, global_step=step)
            n += 1
    writer.flush()
    return n


def metrics_to_tensorboard(run_dir: str | Path) -> Path:
    """Write ``<run>/tensorboard/`` from the run's metrics.parquet (for runs trained without ``report_to``), replacing
    event files a previous conversion or a live tracker wrote, atomically. Returns the event directory."""
    from brorl_lab.core.rundir import RunDir, atomic_write_dir

    run = Path(run_dir)
    metrics = run / "metrics.parquet"
    if not metrics.is_file():
        raise UserError(f"run: {run} has no metrics.parquet; allowed: a run directory written by Trainer")
    rows = RunDir(run).read_metrics().to_dict("records")

    def write(tmp: Path) -> None:
        writer = tensorboard_writer(tmp)
        write_scalars(writer, rows)
        writer.close()

    return atomic_write_dir(run / TENSORBOARD_DIR, write)


def _tfrecords(path: str | Path) -> Iterable[bytes]:
    """The records of a TFRecord file: [u64 length][u32 crc][data][u32 crc] each."""
    data = Path(path).read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        yield data[pos + 12:pos + 12 + length]
        pos += 12 + length + 4


def read_tensorboard(logdir: str | Path) -> pd.DataFrame:
    """Every scalar in the event files under ``logdir`` (a run's tensorboard/ or a run directory): columns tag, step,
    value, in file order; events a later file purges (a resumed run's ``purge_step``) are dropped."""
    from tensorboardX.proto import event_pb2

    logdir = Path(logdir)
    if (logdir / TENSORBOARD_DIR).is_dir():
        logdir = logdir / TENSORBOARD_DIR
    rows: list[dict] = []
    for f in sorted(glob.glob(str(logdir / "**" / "events.out.tfevents.*"), recursive=True),
                    key=os.path.getmtime):
        for rec in _tfrecords(f):
            ev = event_pb2.Event()
            ev.ParseFromString(rec)
            if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
                rows = [r for r in rows if r["step"] < ev.step]  # purge_step: later events replace these
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    rows.append({"tag": v.tag, "step": ev.step, "value": v.simple_value})
    return pd.DataFrame(rows, columns=["tag", "step", "value"])


# ---- W&B offline runs: read back --------------------------------------------------------------------------------------
def read_wandb(run_dir: str | Path) -> pd.DataFrame:
    """The history rows of the offline W&B runs under ``<run>/wandb/`` (one row per logged step, our column names
    plus W&B's ``_step``, ``_timestamp``, ``_runtime``), read from the ``.wandb`` files with W&B's own protobufs (the
    file is a LevelDB-style log: 32 KiB blocks of [u32 crc][u16 length][u8 type] chunks after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    root = run_dir / WANDB_DIR if (run_dir / WANDB_DIR).is_dir() else run_dir
    rows = []
    for f in sorted(glob.glob(str(root / "*run-*" / "run-*.wandb")), key=os.path.getmtime):
        for data in _leveldb_records(Path(f).read_bytes()):
            rec = pb.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in rec.history.item})
    return pd.DataFrame(rows)


def _leveldb_records(data: bytes, header: int = 7, block: int = 32768) -> Iterable[bytes]:
    pos, buf = header, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:  # FULL
            yield chunk
        elif kind == 2:  # FIRST
            buf = chunk
        elif kind == 3:  # MIDDLE
            buf += chunk
        elif kind == 4:  # LAST
            yield buf + chunk
            buf = b""
