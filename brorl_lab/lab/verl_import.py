"""``python -m brorl_lab import-run --from verl LOGDIR RUN/``: a verl run's logged metrics as a brorl_lab run
directory (config.yaml, metrics.parquet, status), so ``report``, the run browser and the flagship's analysis
(equal samples / updates / wall time, the dynamic-sampling pass rate) read a cluster run like one of ours.

What verl 0.9.1 writes (``verl.utils.tracking.Tracking``) and what is read here:

    file logger     one JSON object per log call: {"step": s, "data": {metric: value}}  (VERL_FILE_LOGGER_PATH;
                    run_verl.sh puts it in OUT/logs/metrics.jsonl). Validation before training is step 0.
    console logger  one line per log call: "step:s - key:value - key:value ..." (LocalLogger; OUT/logs/console.log)

Rows of one step are merged. Our columns, per step s (P = data.train_batch_size prompts, N = rollout.n):

    reward_mean            critic/score/mean (the verifier's reward before any KL-in-reward)
    kl                     actor/kl_loss, or actor/reward_kl_penalty when the KL is in the reward
    entropy, grad_norm, lr actor/entropy, actor/grad_norm, actor/lr
    response_length_*      response_length/mean, /max; truncation_rate = response_length/clip_ratio
    step_wall_s            timing_s/step; time/eval = timing_s/testing
    evicted groups E       training/filter_groups/evicted_samples + discarded_surplus_samples (both count groups)
    ds_pass_rate           P / (P + E)  (kept / generated groups; NaN without dynamic sampling)
    samples                (P + E) * N generated; cum_samples, cum_updates (optimizer_steps_per_step a step),
                           cum_wall_s (step time less evaluation) are their running sums
    eval/<family>/pass@1   val-core/<family>/acc/mean@n  (acc = our `correct`, n = eval_samples); eval/mean/pass@1

Every other numeric verl metric is kept beside them as ``verl_metrics.parquet``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import yaml

from brorl_lab.core.config import Config, ConfigError
from brorl_lab.core.rundir import RunDir, atomic_write, check_writable
from brorl_lab.core.runlock import RunLock
from brorl_lab.core.validation import UserError

#: verl metric -> our metrics.parquet column (the first present wins for a column named twice).
VERL_METRICS = {
    "critic/score/mean": "reward_mean",
    "actor/kl_loss": "kl",
    "actor/reward_kl_penalty": "kl",
    "actor/entropy": "entropy",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "actor/pg_loss": "policy_loss",
    "response_length/mean": "response_length_mean",
    "response_length/max": "response_length_max",
    "response_length/clip_ratio": "truncation_rate",
    "timing_s/step": "step_wall_s",
    "timing_s/testing": "time/eval",
}
EVICTED = ("training/filter_groups/evicted_samples", "training/filter_groups/discarded_surplus_samples")
VAL_PASS1 = re.compile(r"^val-core/(?P<family>.+)/acc/mean@(?P<n>\d+)$")
CONSOLE_LINE = re.compile(r"^step:(?P<step>\d+) - (?P<rest>.*)$")
LOG_ALLOWED = ("allowed: verl's file-logger jsonl (trainer.logger includes 'file'; launch's run_verl.sh writes "
               "OUT/logs/metrics.jsonl), its console log (lines 'step:N - key:value - ...'), or a directory holding "
               "one of them")


# ---- reading verl's logs ---------------------------------------------------------------------------------------------
def _parse_console_value(v: str):
    try:
        return float(v)
    except ValueError:
        return None


def read_verl_log(path: str | Path) -> pd.DataFrame:
    """One row per step (merged over log calls) from a file-logger jsonl or a console log; numeric metrics only."""
    path = Path(path)
    by_step: dict[int, dict] = {}
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                    step, data = int(rec["step"]), rec["data"]
                except (ValueError, KeyError, TypeError) as e:
                    raise UserError(f"LOGDIR: {path} line {n} is not a verl file-logger record ({e}); "
                                     f"{LOG_ALLOWED}") from None
            elif m := CONSOLE_LINE.match(line):
                step = int(m["step"])
                data = {k: _parse_console_value(v) for k, _, v in (p.partition(":") for p in m["rest"].split(" - "))}
            else:
                continue  # other console output (progress bars, prints)
            row = by_step.setdefault(step, {"step": step})
            row.update({k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if not by_step:
        raise UserError(f"LOGDIR: {path} holds no verl metrics; {LOG_ALLOWED}")
    return pd.DataFrame([by_step[s] for s in sorted(by_step)])


def find_log(logdir: str | Path) -> Path:
    """The metrics log in ``logdir``: the file itself, else exactly one *.jsonl below it, else console.log."""
    p = Path(logdir)
    if p.is_file():
        return p
    if not p.is_dir():
        raise UserError(f"LOGDIR: {p} does not exist; {LOG_ALLOWED}")
    jsonl = sorted(p.rglob("*.jsonl"))
    if len(jsonl) > 1:
        raise UserError(f"LOGDIR: {p} holds several jsonl files ({', '.join(map(str, jsonl))}); allowed: name one")
    if jsonl:
        return jsonl[0]
    consoles = sorted(p.rglob("console.log"))
    if len(consoles) == 1:
        return consoles[0]
    raise UserError(f"LOGDIR: {p} holds no *.jsonl and {len(consoles)} console.log files; {LOG_ALLOWED}")


def find_config(logdir: str | Path, log: Path) -> Path:
    """The brorl_config.yaml launch wrote: beside the log, or in a directory above it up to ``logdir``'s parent."""
    stop = Path(logdir).resolve()
    for d in [log.resolve().parent, *log.resolve().parents]:
        if (d / "brorl_config.yaml").is_file():
            return d / "brorl_config.yaml"
        if d == stop.parent or d == d.parent:
            break
    raise ConfigError(f"--config: no brorl_config.yaml at or above {log} (within {logdir}); allowed: --config FILE, "
                      "the config the run was launched with (launch --to verl writes OUT/brorl_config.yaml)")


# ---- our columns -----------------------------------------------------------------------------------------------------
def to_brorl_metrics(raw: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """verl's per-step metrics as our metrics.parquet columns (see module doc)."""
    df = pd.DataFrame({"step": raw["step"].astype(int)})
    for key, col in VERL_METRICS.items():
        if key in raw and col not in df:
            df[col] = raw[key].to_numpy()
    P, N = cfg.prompts_per_step, cfg.rollouts_per_prompt
    train = df["step"] > 0
    evicted = sum((raw[k].fillna(0.0) for k in EVICTED if k in raw), pd.Series(0.0, index=raw.index))
    generated_groups = (P + evicted).where(train, 0.0)
    df["samples"] = (generated_groups * N).to_numpy()
    df["ds_pass_rate"] = (P / generated_groups).where(train & cfg.dynamic_sampling, np.nan).to_numpy()
    wall = df.get("step_wall_s", pd.Series(np.nan, index=df.index)).fillna(0.0)
    df["cum_samples"] = df["samples"].cumsum()
    df["cum_updates"] = (train.astype(int) * cfg.optimizer_steps_per_step).cumsum()
    df["cum_wall_s"] = (wall - df.get("time/eval", pd.Series(0.0, index=df.index)).fillna(0.0)).where(train, 0.0).cumsum()
    fams: list[str] = []
    for key in raw.columns:
        if m := VAL_PASS1.match(key):
            df[f"eval/{m['family']}/pass@1"] = raw[key].to_numpy()
            fams.append(m["family"])
    if fams:
        df["eval/mean/pass@1"] = df[[f"eval/{f}/pass@1" for f in fams]].mean(axis=1, skipna=False)
    return df


def import_verl_run(logdir: str | Path, run: str | Path, *, config: Optional[str | Path] = None,
                    overwrite: bool = False) -> Path:
    """Write the brorl_lab run directory ``run`` from verl's logs in ``logdir`` (see module doc); returns it.
    ``config`` defaults to the brorl_config.yaml launch wrote beside the logs."""
    log = find_log(logdir)
    cfg_path = Path(config) if config else find_config(logdir, log)
    if not cfg_path.is_file():
        raise ConfigError(f"--config: {cfg_path} does not exist; allowed: a YAML file of Config fields")
    cfg_dict = yaml.safe_load(cfg_path.read_text()) or {}
    cfg = Config.from_dict(cfg_dict)
    raw = read_verl_log(log)  # read and check everything before writing
    metrics = to_brorl_metrics(raw, cfg)
    out = Path(run)
    check_writable(out, "RUN")
    with RunLock.acquire(out, what="RUN"):  # one writer: not while a Trainer (or another import) writes it
        if RunDir.holds_run(out) and not overwrite:
            raise ConfigError(f"RUN: {out} already holds a run ({', '.join(RunDir.run_files_in(out))}); allowed: a "
                              "new directory, or --overwrite")
        RunDir.clear_run(out)  # --overwrite, or what an earlier attempt left: a clean directory
        _write_run(RunDir(out), cfg, raw, metrics, log)
    return out


def _write_run(rd: RunDir, cfg: Config, raw: pd.DataFrame, metrics: pd.DataFrame, log: Path) -> None:
    out = rd.path
    rd.write_config({**cfg.to_dict(), "run_name": out.name})
    rd.write_metrics(metrics.to_dict("records"))
    atomic_write(out / "verl_metrics.parquet", lambda f: raw.to_parquet(f, index=False))
    steps = int(metrics["step"].max())
    finished = steps >= cfg.steps
    rd.write_status("finished" if finished else "stopped", step=steps, source="verl", log=str(log.resolve()))
    rd.log_event("imported", source="verl", log=str(log.resolve()), steps=steps, rows=len(metrics),
                 verl_metrics=int(len(raw.columns) - 1))
