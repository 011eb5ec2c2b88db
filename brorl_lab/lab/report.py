"""One self-contained HTML page for a run or a set of runs: what ``python -m brorl_lab report`` and ``train`` write.

    write_report(["runs/a"])                                   # runs/a/report.html
    write_report(["runs/sweeps/n"])                            # every run below it, overlaid: runs/sweeps/n/report.html
    write_report(["runs/a", "runs/b"], out="a_vs_b.html")      # runs from anywhere, overlaid

The page holds the runs (status, steps, final numbers), their config (for several runs the settings that differ
first, the shared ones folded), the training curves (reward, pass rate, KL, entropy, clipped shares, response
length, samples/s: whichever the runs logged), held-out pass@1 per family during training, and the pass@k table
with pass@k against k. Several runs are overlaid in every panel, each labelled by the config settings that tell it
apart: the run browser's view, without a kernel. plotly.js (4.8 MB) is not inside the page: :func:`write_report`
writes it once beside the page as ``plotly.min.js`` (every report in that folder shares it), so a page
stays well under 1 MB and still opens offline; :func:`report_html` alone embeds it (a string has no folder).

Figures come from :mod:`brorl_lab.lab.plots`, tables from :mod:`brorl_lab.lab.analysis` and
:mod:`brorl_lab.lab.tracking`; this module only picks the panels and lays out the page.
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import pandas as pd

from brorl_lab.core.validation import UserError
from brorl_lab.lab import analysis, plots, stats, tracking

REPORT_FILE = "report.html"
PLOTLYJS_FILE = "plotly.min.js"  # beside the page, shared by every report in its folder (see write_plotlyjs)
TRAINING_METRICS = ("reward_mean", "pass_at_1", "ds_pass_rate", "kl", "entropy", "clipfrac_high", "clipfrac_low",
                    "response_length_mean", "samples_per_s")
# A run's legend label names the config settings that differ between the runs, the seed included (runs are not
# pooled here); fields that only name or place a run never tell runs apart.
LABEL_IGNORE = tuple(f for f in analysis.ARM_IGNORE if f != "seed")
SUMMARY_COLUMNS = ("run", "label", "status", "steps_done", "steps_trained", "final.reward_mean", "final.eval/mean/pass@1",
                   "final.cum_samples", "final.cum_wall_s", "error")
RUNS_ALLOWED = ("allowed: a run directory written by `train` (config.yaml and metrics.parquet), or a directory "
                "holding such runs (a sweep, a runs root)")
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
.note { color: #666; } details { margin: 0.5em 0; }
"""


# ---- which runs -------------------------------------------------------------------------------------------------------
def collect_runs(paths: Sequence[str | os.PathLike], *, allow_empty: bool = False) -> dict[str, Path]:
    """{name: directory} of the Trainer runs at or below each of ``paths``, named by their path below the deepest
    directory they share (one run: its directory's name). A path that does not exist, or holds no run while
    ``allow_empty`` is False, is an error naming it."""
    dirs: list[Path] = []
    for p in _check_paths(paths):
        if not p.is_dir():
            raise UserError(f"runs: {p} is not a directory; {RUNS_ALLOWED}")
        found = tracking.find_run_dirs(p)
        if not found and not allow_empty:
            raise UserError(f"runs: {p} holds no training run (no config.yaml next to a metrics.parquet at or "
                             f"below it); {RUNS_ALLOWED}")
        dirs += [d.resolve() for d in found]
    dirs = list(dict.fromkeys(dirs))
    if len(dirs) == 1:
        return {dirs[0].name: dirs[0]}
    common = Path(os.path.commonpath(dirs)) if dirs else Path()
    return {str(d.relative_to(common)): d for d in dirs}


def _check_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence) or not paths:
        raise UserError(f"runs: got {paths!r}; {RUNS_ALLOWED}: a list of one or more")
    return [Path(p) for p in paths]


def run_labels(df: pd.DataFrame) -> dict[str, str]:
    """{run: legend label}: the config settings that differ between the runs (e.g. ``"lr=0.001, seed=1"``); the run
    name for a single run, for runs whose configs do not differ, and appended where two runs share a label."""
    runs = list(dict.fromkeys(df["run"])) if "run" in df else []
    if len(runs) < 2:
        return {r: r for r in runs}
    labels = analysis.arm_labels(df, ignore=LABEL_IGNORE).to_dict()
    counts = pd.Series(labels).value_counts()
    return {r: r if labels[r] == "all runs" else labels[r] if counts[labels[r]] == 1 else f"{labels[r]} ({r})"
            for r in runs}


# ---- sections: (heading, HTML) --------------------------------------------------------------------------------------
def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, border=0, na_rep="", float_format=lambda v: f"{v:.4g}", escape=True)


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _figure(fig) -> str:
    import plotly.io as pio

    return pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False, default_width="100%",
                       config={"responsive": True})


def runs_section(runs: Mapping[str, Path], labels: Mapping[str, str]) -> str:
    """Status, steps done and final numbers of each run (:func:`brorl_lab.lab.tracking.run_summary`)."""
    rows = pd.DataFrame([{**tracking.run_summary(path, name), "label": labels.get(name, name)}
                         for name, path in runs.items()])
    idle = rows[(rows.get("steps_trained", pd.Series(dtype=float)) == 0) & (rows.get("steps_done", 0) > 0)]
    warnings = "".join(_note(f"warning: {r} trained on nothing: every one of its {n} steps was skipped (no "
                             "informative group, or non-finite); see its events.jsonl")
                       for r, n in zip(idle["run"], idle["steps_done"]))
    return _table(rows[[c for c in SUMMARY_COLUMNS if c in rows]]) + warnings


def config_section(df: pd.DataFrame) -> str:
    """One run: its config as field/value rows. Several: the settings that differ (one row per run), then the
    shared ones folded away."""
    per_run = df.groupby("run", sort=False).first()
    cfg = per_run[[c for c in per_run.columns if c.startswith("cfg.")]].rename(columns=lambda c: c[4:])
    if cfg.empty:
        return _note("no config.yaml in these runs")
    if len(cfg) == 1:
        return _table(cfg.T.reset_index().set_axis(["field", "value"], axis=1).astype(str))
    differs = [c for c in cfg.columns if cfg[c].astype(str).nunique(dropna=False) > 1]
    shared = cfg.drop(columns=differs).iloc[0].astype(str).reset_index().set_axis(["field", "value"], axis=1)
    head = (_table(cfg[differs].astype(str).reset_index()) if differs
            else _note("every config field is the same in all runs"))
    return head + f"<details><summary>{len(shared)} settings shared by all runs</summary>{_table(shared)}</details>"


def training_section(df: pd.DataFrame, labels: Mapping[str, str], x: str) -> str:
    """The training curves the runs logged (:data:`TRAINING_METRICS`), one panel each, runs overlaid."""
    metrics = [m for m in TRAINING_METRICS if m in df and df[m].notna().any()]
    if not metrics:
        return _note("no training steps logged yet")
    return _figure(plots.metrics_grid_figure(df, metrics, x=x, names=labels, cols=3, height_per_row=280))


def held_out_section(df: pd.DataFrame, labels: Mapping[str, str], x: str) -> str:
    """Held-out pass@1 of each family during training, then pass@k at the first and last evaluation: a table per
    run and k, and pass@k (and its gain) against k."""
    families = analysis.eval_families(df)
    if not families:
        return _note("no held-out evaluations in these runs (eval_every = 0, or none reached yet)")
    curves = plots.metrics_grid_figure(df, [f"eval/{f}/pass@1" for f in families], x=x, names=labels,
                                       cols=min(3, len(families)), title="Held-out pass@1 during training")
    family = families[0]  # "mean" when present
    table = analysis.pass_at_k_table(df, family=family, labels=labels)
    shown = table.drop(columns="run").rename(columns={"arm": "run"})
    return (_figure(curves) + f"<h3>{html.escape(family)} pass@k at the first and last evaluation</h3>"
            + _table(shown) + _figure(plots.pass_at_k_figure(analysis.arm_pass_at_k(table), family=family,
                                                             title=f"{family} pass@k before and after training")))


#: Config fields that do not make two runs different configs: the seed pairs them; the others say where they ran.
NOT_CONFIG = ("seed", "run_name", "run_dir", "torch_threads", "report_to")
COMPARE_METRIC = "eval/mean/pass@1"


def compare_runs(df: pd.DataFrame, metric: str = COMPARE_METRIC) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs grouped by config (every ``cfg.`` field but :data:`NOT_CONFIG`), each group's seeds and its mean final
    ``metric``; and, for every two groups that share seeds, the paired t interval of the difference at their
    last evaluation, b - a over the shared seeds (:func:`brorl_lab.lab.stats.paired_t_interval`: seed s of one
    config against seed s of the other, so the seed-to-seed spread both share cancels). Returns (groups, pairs);
    both empty when no run evaluated ``metric``."""
    if df.empty or metric not in df:
        return pd.DataFrame(), pd.DataFrame()
    last = df.dropna(subset=[metric]).sort_values("step").groupby("run").tail(1)
    fields = [c for c in last.columns if c.startswith("cfg.") and c[4:] not in NOT_CONFIG]
    varying = [c for c in fields if last[c].astype(str).nunique() > 1]
    last = last.assign(config=last[varying].astype(str).apply(
        lambda r: ", ".join(f"{c[4:]}={v}" for c, v in r.items()), axis=1) if varying else "all runs")
    groups, seeds = [], {}
    for config, g in last.groupby("config", sort=False):
        seeds[config] = dict(zip(g["cfg.seed"], g[metric]))
        groups.append({"config": config, "seeds": " ".join(str(s) for s in sorted(seeds[config])), "runs": len(g),
                       metric: float(g[metric].mean())})
    pairs = []
    names = list(seeds)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = sorted(set(seeds[a]) & set(seeds[b]))
            if len(shared) >= 2:
                r = stats.paired_t_interval([seeds[b][s] for s in shared], [seeds[a][s] for s in shared])
                pairs.append({"b": b, "a": a, "seeds": len(shared), f"{metric} b - a": stats.format_interval(r)})
    return pd.DataFrame(groups), pd.DataFrame(pairs)


def compare_text(df: pd.DataFrame, metric: str = COMPARE_METRIC) -> str:
    """:func:`compare_runs` as the lines a console prints (empty when there is nothing to compare)."""
    groups, pairs = compare_runs(df, metric)
    if groups.empty:
        return ""
    text = "by config:\n" + groups.to_string(index=False, float_format=lambda v: f"{v:.4f}")
    if not pairs.empty:
        text += "\npaired by seed (95% t interval, points of pass@1):\n" + pairs.to_string(index=False)
    elif len(groups) > 1:
        text += "\nno two configs share 2 or more seeds: no paired interval"
    return text


def compare_section(df: pd.DataFrame) -> str:
    groups, pairs = compare_runs(df)
    if groups.empty:
        return _note(f"no run evaluated {COMPARE_METRIC}")
    return _table(groups) + (_table(pairs) if not pairs.empty else _note(
        "no two configs share 2 or more seeds: no paired interval"))


def report_html(paths: Sequence[str | os.PathLike], *, title: Optional[str] = None, x: str = "step",
                index: Optional[pd.DataFrame] = None, allow_empty: bool = False,
                plotlyjs_src: Optional[str] = None) -> str:
    """The report page of the runs at or below ``paths`` (see the module docstring); ``index`` (a sweep's index)
    adds a table of every run the sweep made, its status and parameters. plotly.js is embedded in the page, or, with
    ``plotlyjs_src`` (a path relative to the page), loaded from that file."""
    if x not in plots.X_AXES:
        raise UserError(f"x: got {x!r}; allowed: {', '.join(plots.X_AXES)}")
    runs = collect_runs(paths, allow_empty=allow_empty)
    df = tracking.load_run_dirs(runs)
    labels = run_labels(df)
    title = title or (f"Run {next(iter(runs))}" if len(runs) == 1 else f"{len(runs)} runs")
    sections = [] if index is None else [("Sweep index", _table(index))]
    if not runs:
        sections.append(("Runs", _note("no training runs (config.yaml with metrics.parquet) in these directories")))
    else:
        sections += [("Runs", runs_section(runs, labels)), ("Config", config_section(df)),
                     *([("Compared by config, paired by seed", compare_section(df))] if len(runs) > 1 else []),
                     ("Training curves", training_section(df, labels, x)),
                     ("Held-out evaluation", held_out_section(df, labels, x))]
    return _page(title, sections, plotlyjs_src)


def _page(title: str, sections: Sequence[tuple[str, str]], plotlyjs_src: Optional[str] = None) -> str:
    from plotly.offline import get_plotlyjs

    body = "".join(f"<h2>{html.escape(head)}</h2>\n{content}\n" for head, content in sections)
    made = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    script = (f'<script src="{html.escape(plotlyjs_src)}"></script>' if plotlyjs_src
              else f"<script>{get_plotlyjs()}</script>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style>{script}</head>\n<body><h1>{html.escape(title)}</h1>"
            f'<p class="note">brorl_lab report, written {made}</p>\n{body}</body></html>\n')


def write_report(paths: Sequence[str | os.PathLike], out: Optional[str | os.PathLike] = None, **options) -> Path:
    """Write :func:`report_html` of ``paths`` to ``out`` (default: ``<path>/report.html`` for a single path; an
    existing directory gets ``report.html`` inside) atomically; returns the file written."""
    out = _out_path(paths, out)
    text = report_html(paths, plotlyjs_src=PLOTLYJS_FILE, **options)  # checks the runs before anything is written
    write_plotlyjs(out.parent)
    return tracking.atomic_write_text(out, text)


def write_plotlyjs(folder: str | os.PathLike) -> Path:
    """``folder/plotly.min.js``, written (atomically) unless it already holds this plotly.js; shared by every report
    page in ``folder``."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLYJS_FILE
    js = get_plotlyjs()
    if not path.is_file() or path.read_text() != js:
        tracking.atomic_write_text(path, js)
    return path


def _out_path(paths: Sequence[str | os.PathLike], out: Optional[str | os.PathLike]) -> Path:
    paths = _check_paths(paths)
    if out is None:
        if len(paths) != 1:
            raise UserError(f"out: needed for a report of {len(paths)} paths; allowed: a file name ending in .html "
                             f"(only the report of one path has a default, <path>/{REPORT_FILE})")
        return paths[0] / REPORT_FILE
    out = Path(out)
    if out.is_dir():
        return out / REPORT_FILE
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"out: got {str(out)!r}; allowed: a file name ending in .html, or an existing directory")
    return out


def try_write_report(paths: Sequence[str | os.PathLike], out: Optional[str | os.PathLike] = None,
                     **options) -> Optional[Path]:
    """:func:`write_report` for the end of a run or sweep, whose results are already safe on disk: a report that
    cannot be written is said on stderr (with the reason) instead of failing the command; returns the file or None."""
    try:
        return write_report(paths, out, **options)
    except Exception as e:  # noqa: BLE001 - the run's data stand; the report is a view of them
        print(f"report not written ({type(e).__name__}: {str(e).strip()[:300]})", file=sys.stderr)
        return None
