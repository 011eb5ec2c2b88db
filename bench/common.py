"""What every benchmark figure shares: result rows, interleaved timing, child processes, the model, the prompts and
the FLOP count.

Rows are plain dicts ``{"group", "figure", "value", "unit", "target", "met", "note", ...}``; ``met`` is True/False
where a target is stated and None where there is none. Times are medians of interleaved repetitions (A, B, A, B,
...), so a burst of load from the other users of this machine hits both sides of a ratio alike.

FLOPs (model FLOPs, what MFU counts): a forward pass costs ``2 * non_embedding_params`` per token fed plus
``2 * V * D`` (the LM head) per token whose logits are computed; forward + backward is 3x that. Attention score and
value products (``4 * context * D`` per token and layer, ~2-3% more at these lengths) and padding are not counted.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
# The default model is trained on these (data/default_model/training_report.json); benches mix them uniformly.
BENCH_FAMILIES = ("chain_sum", "gcd", "products", "simple_equations")


# ---- rows ---------------------------------------------------------------------------------------------------------
def row(group: str, figure: str, value: float, unit: str, target: Optional[str] = None, note: str = "",
        met: Optional[bool] = None, **extra) -> dict:
    """One result row; ``met`` is derived from a target like ``">= 3"`` / ``"< 10 ms"`` unless given."""
    value = float(value)
    if met is None and target:
        met = target_met(value, target)
    return {"group": group, "figure": figure, "value": value, "unit": unit, "target": target, "met": met,
            "note": note, **extra}


_TARGET = re.compile(r"^\s*(<=|>=|<|>)\s*([-+0-9.eE]+)")


def target_met(value: float, target: Optional[str]) -> Optional[bool]:
    """Whether ``value`` meets a target written ``"<op> <number>[unit]"``; None if there is no parsable target."""
    m = _TARGET.match(str(target or ""))
    if not m or not math.isfinite(value):
        return None if not m else False
    op, bound = m.group(1), float(m.group(2))
    return {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[op]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def format_table(rows: Sequence[dict]) -> str:
    """The printed table: figure, value, unit, target, met?, note."""
    head = f"{'figure':<60} {'value':>11} {'unit':<10} {'target':<9} {'met?':<5} note"
    lines = [head, "-" * len(head)]
    for r in rows:
        met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
        lines.append(f"{r['figure']:<60} {_fmt(r['value']):>11} {r['unit']:<10} {r.get('target') or '-':<9} "
                     f"{met:<5} {r.get('note', '')}")
    return "\n".join(lines)


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


# ---- timing -------------------------------------------------------------------------------------------------------
def interleave(cases: dict[str, Callable[[], Any]], repeats: int, *, warmup: bool = True):
    """Run ``cases`` round-robin ``repeats`` times (A, B, A, B, ...) after one untimed warm-up call each.

    Returns ``(seconds, results)``: per case the list of wall times and the list of return values."""
    if warmup:
        for fn in cases.values():
            fn()
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    results: dict[str, list[Any]] = {k: [] for k in cases}
    for _ in range(repeats):
        for key, fn in cases.items():
            t0 = time.perf_counter()
            out = fn()
            seconds[key].append(time.perf_counter() - t0)
            results[key].append(out)
    return seconds, results



def classify_op(op: str, classes, default: str) -> str:
    """The first name in ``classes`` (``(name, substrings)`` pairs) with a substring in the torch.profiler op name
    ``op`` (case-insensitive); ``default`` when none has."""
    low = op.lower()
    for name, keys in classes:
        if any(k.lower() in low for k in keys):
            return name
    return default


def profile_by_class(fn: Callable[[], Any], classify: Callable[[str], str], outside: str,
                     with_flops: bool = False) -> tuple[dict, dict, float]:
    """``({class: seconds}, {class: FLOPs}, wall seconds)`` of ``fn()`` under torch.profiler: each op's self CPU
    time summed by ``classify(op name)``, and the wall time no op accounts for under ``outside``. FLOPs are the
    profiler's count (zero unless ``with_flops``, which keeps every op's input shapes: memory grows with the run)."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], with_flops=with_flops) as prof:
        fn()
    wall = time.perf_counter() - t0
    secs: dict[str, float] = {}
    flops: dict[str, float] = {}
    for ev in prof.key_averages():
        cls = classify(ev.key)
        secs[cls] = secs.get(cls, 0.0) + ev.self_cpu_time_total / 1e6
        flops[cls] = flops.get(cls, 0.0) + (ev.flops or 0)
    secs[outside] = max(wall - sum(secs.values()), 0.0)
    return secs, flops, wall

def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def set_threads(threads: Optional[int]) -> int:
    """``torch.set_num_threads`` (default: $OMP_NUM_THREADS where set, else every core this process may use);
    returns the count in force."""
    import torch

    torch.set_num_threads(int(threads or default_threads()))
    return torch.get_num_threads()


def default_threads() -> int:
    """$OMP_NUM_THREADS where it is set (a test worker sets 1: the bench smoke at 2 threads beside the other worker
    thrashed, 0.19 GFLOP/s for a 256 matmul), else the cores this process may use."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# ---- memory -------------------------------------------------------------------------------------------------------
def peak_rss_mib() -> float:
    """This process's peak resident set in MiB: ``VmHWM``, the high-water mark of its own address space.

    Not ``ru_maxrss``: on Linux exec keeps the pre-exec high-water mark in it, so a child started from a big parent
    (this bench, with vllm loaded) reports at least the parent's RSS at fork. ``ru_maxrss`` is the fallback."""
    hwm = _proc_status_mib("VmHWM")
    return hwm if math.isfinite(hwm) else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """This process's current resident set in MiB (``VmRSS``)."""
    return _proc_status_mib("VmRSS")


def _proc_status_mib(field: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return float("nan")


# ---- child processes ----------------------------------------------------------------------------------------------
def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    return env


def run_child(module: str, payload: dict, *, threads: int, timeout: float = 1800) -> dict:
    """Run ``python -m <module> --child <payload json> --out <file>`` (see :func:`child_main`) in a fresh process
    and return the JSON it wrote. The child's own peak RSS (:func:`peak_rss_mib`) is in the result."""
    with tempfile.TemporaryDirectory(prefix="brorl_bench_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", module, "--child", json.dumps({**payload, "threads": threads, "tmp": tmp}),
               "--out", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(threads), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"{module} child {payload.get('side', '')} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def child_main(fn: Callable[..., dict], argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of a child: ``fn(payload) -> dict`` runs with the payload's thread count; its result, plus this
    process's ``peak_rss_mib``, is written as JSON to ``--out``. With ``--lockstep`` (see :class:`Lockstep`) it is
    called as ``fn(payload, link)`` and its result goes back over the link instead."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--out")
    ap.add_argument("--lockstep", action="store_true")
    args = ap.parse_args(argv)
    payload = json.loads(args.child)
    set_threads(payload.get("threads"))
    link = ParentLink() if args.lockstep else None
    result = fn(payload, link) if link else fn(payload)
    result["peak_rss_mib"] = peak_rss_mib()
    if link:
        link.send("result", result)
    else:
        Path(args.out).write_text(json.dumps(result))


class ParentLink:
    """The child's end of a :class:`Lockstep` pipe: protocol lines go out on the original stdout (everything the
    libraries print is moved to stderr), ``step`` commands come in on stdin."""

    def __init__(self):
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # print() and library logs now land on stderr, never in the protocol

    def send(self, kind: str, body: Optional[dict] = None) -> None:
        self._out.write(f"{kind} {json.dumps(body or {})}\n")

    def ready(self, **info) -> None:
        """Set-up is done (info: e.g. the RSS before the first step); wait for the first ``step``."""
        self.send("ready", info)

    def wait_step(self) -> None:
        line = sys.stdin.readline()
        if line.strip() != "step":
            raise SystemExit(f"lockstep: expected 'step', got {line!r}")

    def done(self, seconds: float, **info) -> None:
        self.send("done", {"seconds": seconds, **info})


class Lockstep:
    """Children that each run one step per ``step`` command, so the parent can interleave them step by step
    (A, B, C, A, B, C, ...): a child waiting for its command is blocked on a read and uses no CPU, so exactly one
    side computes at a time and a burst of outside load lands on whichever step it lands on, not on one side's
    whole run. Each child is still its own process (its own peak RSS).

        with Lockstep(MODULE, payloads, threads=2) as ls:   # payloads: {side: payload}
            ls.ready()                                      # {side: ready info}
            ls.step("brorl")                                # {"seconds": ..., ...}
            ls.finish()                                     # {side: result}
    """

    def __init__(self, module: str, payloads: dict, *, threads: int, timeout: float = 1800):
        self.timeout = timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="brorl_bench_")
        self.procs, self.logs = {}, {}
        for side, payload in payloads.items():
            self.logs[side] = open(Path(self._tmp.name) / f"{side}.stderr", "w+")
            body = json.dumps({**payload, "threads": threads, "tmp": self._tmp.name})
            self.procs[side] = subprocess.Popen([sys.executable, "-m", module, "--child", body, "--lockstep"], cwd=REPO,
                                                env=child_env(threads), stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=self.logs[side], text=True, bufsize=1)

    def _expect(self, side: str, kind: str) -> dict:
        import threading

        watchdog = threading.Timer(self.timeout, self.procs[side].kill)  # a hung child ends the read with EOF
        watchdog.start()
        try:
            line = self.procs[side].stdout.readline()
        finally:
            watchdog.cancel()
        got, _, body = line.partition(" ")
        if got != kind:
            self.procs[side].wait(timeout=30)
            self.logs[side].seek(0)
            tail = "\n".join(self.logs[side].read().strip().splitlines()[-15:])
            raise RuntimeError(f"lockstep child {side!r}: expected {kind!r}, got {line[:200]!r} "
                               f"(exit {self.procs[side].returncode}):\n{tail}")
        return json.loads(body)

    def ready(self) -> dict:
        return {side: self._expect(side, "ready") for side in self.procs}

    def step(self, side: str) -> dict:
        self.procs[side].stdin.write("step\n")
        self.procs[side].stdin.flush()
        return self._expect(side, "done")

    def finish(self) -> dict:
        out = {side: self._expect(side, "result") for side in self.procs}
        for proc in self.procs.values():
            proc.wait(timeout=self.timeout)
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for f in self.logs.values():
            f.close()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- model, prompts, FLOPs ----------------------------------------------------------------------------------------
@contextmanager
def fresh_clone() -> Iterator[tuple[Path, dict, str]]:
    """A fresh clone of HEAD in a temporary folder, as a newcomer (or CI) gets it: yields (the clone, an environment
    whose ``PYTHONPATH`` is the clone, HEAD's short commit). Run it with this checkout's venv (``sys.executable``):
    every process started there, notebook kernels included, imports the clone's package, not the editable install's."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        yield clone, {**os.environ, "PYTHONPATH": str(clone)}, commit


def model_path() -> str:
    """The shipped default model; while it is missing, a tiny random Qwen2 (tests/helpers_models.save_tiny)."""
    from brorl_lab.core.models import DEFAULT_MODEL_DIR

    if (DEFAULT_MODEL_DIR / "config.json").is_file() and any(DEFAULT_MODEL_DIR.glob("*.safetensors")):
        return str(DEFAULT_MODEL_DIR)
    path = Path(tempfile.gettempdir()) / "brorl_bench_tiny_model"
    if not (path / "config.json").is_file():
        sys.path.insert(0, str(REPO / "tests"))
        from helpers_models import save_tiny

        save_tiny(path, hidden=64, heads=2, kv_heads=1)
    return str(path)


def bench_items(count: int, seed: int = 0):
    """``count`` task items mixed over :data:`BENCH_FAMILIES` (deterministic in seed)."""
    from brorl_lab.rl.steps import sample_prompts

    return sample_prompts(BENCH_FAMILIES, count, seed=seed)


def format_prompts(items, tokenizer=None, template: str = "plain") -> list[str]:
    from brorl_lab.rollout.tasks import TASKS

    return [TASKS[it.family].format_prompt(it, template, tokenizer) for it in items]


def param_counts(model) -> tuple[int, int]:
    """``(non_embedding_params, lm_head_params)``: the matmul weights every token passes through, and the LM head
    (counted only where logits are computed). Tied or not, the input embedding lookup costs no FLOPs."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    untied_head = head.numel() if head.data_ptr() != emb.data_ptr() else 0
    return total - emb.numel() - untied_head, head.numel()


def forward_flops(counts: tuple[int, int], tokens_fed: float, logit_tokens: float) -> float:
    """Model FLOPs of a forward pass over ``tokens_fed`` tokens, computing logits at ``logit_tokens`` of them."""
    body, head = counts
    return 2.0 * (body * tokens_fed + head * logit_tokens)


def model_summary(path: str) -> dict:
    """Size of the bench model, for the machine line and the notes."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    return {"path": os.path.relpath(path, REPO) if path.startswith(str(REPO)) else path,
            "model_type": cfg.model_type, "hidden_size": cfg.hidden_size, "layers": cfg.num_hidden_layers,
            "heads": cfg.num_attention_heads, "vocab": cfg.vocab_size}
