"""The per-token step fused by ``torch.compile`` (inductor) against the eager step, side by side in one process.

    .venv/bin/python -m bench.run_all --only fusion [--smoke] [--json PATH]
    .venv/bin/python -m bench.bench_fusion --part update [--smoke] [--json PATH]     # one half alone

Decode: the torch engine's shared-prefix rollout on the long bench's model (``bench/long_model.py``) at P=1 x N
rows of ``new_tokens`` fixed-length tokens, ``TorchEngine(compile_decode=False)`` (eager: every op of the step
dispatched from Python) against ``compile_decode=True`` (the step compiled once with dynamic shapes; norms, RoPE,
SwiGLU, residual adds and the attention softmax fused into C++ loops). Both engines are built and warmed up first
(the fused one's first call pays the compile, reported on its own row), then timed A, B, A, B, ... so load from
the other users of the machine lands on both alike; the figure is the median of the per-pair time ratios.

Update: one update (reference and old log-probs, PPO-clip + KL, backward, AdamW; ``steps.update``) over P=1 x
``update_rows`` responses of ``new_tokens`` tokens, ``Config(compile_step=False)`` against ``compile_step=True``
(the model's RMSNorms and SwiGLU MLPs compiled, forward and backward: ``logprobs.fused_elementwise``), the same
policy, batch and optimizer, interleaved the same way after one warm-up update each (the fused one compiles).

Numerical equality, checked in the same run: near-greedy decoding (top_p = 1e-6 keeps only the argmax token) gives
identical tokens, and the same seed gives the same sampled tokens with log-probs within 1e-5 (the rows say how far
apart they are); the trainer's log-probs of the update batch, fused against eager, within 1e-5. The default of
``Config.compile_step`` follows these rows (``docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .common import bench_items, format_prompts, median, row, set_threads
from .long_model import long_model_path

GROUP = "fusion"
EQUAL_LOGPROBS = 1e-5  # the fused path must give log-probs within this of the eager path's


@dataclass(frozen=True)
class Size:
    n: int  # rows (P=1 prompt x N samples): the long table's N=512 decode call
    new_tokens: int  # every response's length
    repeats: int  # interleaved pairs (eager, fused)
    check_tokens: int  # length of the equality calls
    update_rows: int  # rows of the update batch (P=1)
    update_budget: int  # micro-batch token budget of the update (the long step's)


FULL = Size(n=512, new_tokens=256, repeats=3, check_tokens=32, update_rows=64, update_budget=18432)
SMOKE = Size(n=8, new_tokens=8, repeats=1, check_tokens=6, update_rows=4, update_budget=256)


def run(smoke: bool = False, threads=None, parts=("decode", "update")) -> list[dict]:
    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    return ((decode_rows(size, threads, smoke) if "decode" in parts else [])
            + (update_rows(size, threads) if "update" in parts else []))


def _side_by_side(what: str, cases: dict, repeats: int, shape: str) -> list[dict]:
    """Time ``cases`` ({"eager": fn(i), "fused": fn(i)}): one warm-up call each (the fused one compiles), then
    ``repeats`` rounds A B, B A, ... (neither side always first). Rows: each side's median, the median of the
    per-pair fused/eager ratios, and the fused side's one-time compile (its first call's extra seconds)."""
    first = {}
    for name, fn in cases.items():
        t0 = time.perf_counter()
        fn(0)
        first[name] = time.perf_counter() - t0
    load_before = os.getloadavg()[0]
    seconds = {k: [] for k in cases}
    for i in range(1, repeats + 1):
        for name in (list(cases) if i % 2 else list(cases)[::-1]):
            t0 = time.perf_counter()
            cases[name](i)
            seconds[name].append(time.perf_counter() - t0)
    fair = (f"{shape}; one process; {repeats} interleaved pair(s) (order alternating) after one warm-up call each; "
            f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    pairs = [f / e for e, f in zip(seconds["eager"], seconds["fused"])]
    rows = [row(GROUP, f"fusion {what} {name}", median(seconds[name]), "s", fairness=fair,
                note="calls: " + ", ".join(f"{s:.3g}" for s in seconds[name])) for name in cases]
    rows.append(row(GROUP, f"fusion {what} fused/eager time", median(pairs), "x", fairness=fair,
                    note="median of per-pair ratios " + ", ".join(f"{p:.3g}" for p in pairs)
                         + "; < 1: the fused step is faster"))
    rows.append(row(GROUP, f"fusion {what.split()[0]} fused first call (compile) - eager first call",
                    first["fused"] - first["eager"], "s",
                    note=f"one-time per process: first calls {first['fused']:.3g} s fused, {first['eager']:.3g} s "
                         "eager (inductor's on-disk cache shortens a later process's compile)"))
    return rows


def decode_rows(size: Size, threads: int, smoke: bool) -> list[dict]:
    import torch

    from brorl_lab.rollout.engines import RolloutSampling
    from brorl_lab.rollout.engines.torch_engine import TorchEngine

    path = long_model_path(smoke)
    engines = {"eager": TorchEngine(path, device="cpu", dtype="float32"),
               "fused": TorchEngine(path, device="cpu", dtype="float32", compile_decode=True)}
    prompts = format_prompts(bench_items(1, seed=0), engines["eager"].tokenizer)

    def sampling(tokens, seed, top_p=1.0):
        return RolloutSampling(temperature=1.0, top_p=top_p, max_new_tokens=tokens, seed=seed, ignore_eos=True)

    shape = (f"long bench model, P=1 x N={size.n} rows x {size.new_tokens} tokens (EOS ignored), T=1.0, top_p=1, "
             f"fp32, {threads} torch threads")
    rows = _side_by_side(f"decode N={size.n} ({size.new_tokens} tokens)",
                         {name: (lambda i, e=e: e.generate(prompts, size.n, sampling(size.new_tokens, 10 + i)))
                          for name, e in engines.items()}, size.repeats, shape)
    # equality: near-greedy tokens, and same-seed sampled tokens and log-probs
    greedy = {k: e.generate(prompts, size.n, sampling(size.check_tokens, 1, 1e-6)) for k, e in engines.items()}
    sampled = {k: e.generate(prompts, size.n, sampling(size.check_tokens, 2)) for k, e in engines.items()}
    for e in engines.values():
        e.close()
    greedy_equal = torch.equal(greedy["eager"].response_ids, greedy["fused"].response_ids)
    sampled_equal = torch.equal(sampled["eager"].response_ids, sampled["fused"].response_ids)
    lp_diff = float((sampled["eager"].logprobs - sampled["fused"].logprobs).abs().max())
    rows.append(row(GROUP, f"fusion decode near-greedy tokens identical ({size.check_tokens} tokens)",
                    float(greedy_equal), "bool", target=">= 1"))
    rows.append(row(GROUP, f"fusion decode sampled tokens identical, same seed ({size.check_tokens} tokens)",
                    float(sampled_equal), "bool"))
    rows.append(row(GROUP, "fusion decode |log-prob fused - eager| max", lp_diff, "nats",
                    target=f"<= {EQUAL_LOGPROBS}"))
    return rows


def update_rows(size: Size, threads: int) -> list[dict]:
    from dataclasses import replace

    import brorl_lab.rl.logprobs as LP

    from .bench_update_attention import update_case

    batch, policy, cfg, update = update_case(size.update_rows, size.new_tokens, size.update_budget)
    configs = {"eager": cfg, "fused": replace(cfg, compile_step=True)}
    shape = (f"long bench model, one update over P=1 x {size.update_rows} rows x {size.new_tokens} tokens, "
             f"micro-batch {size.update_budget} tokens, kl_beta=1e-3, fp32, {threads} torch threads, same policy and "
             "batch")
    rows = _side_by_side(f"update N={size.update_rows} ({size.new_tokens} tokens)",
                         {name: (lambda i, c=c: update(c)) for name, c in configs.items()}, size.repeats, shape)
    lp = {name: LP.compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=size.update_budget,
                                    fused=name == "fused") for name in configs}
    lp_diff = float((lp["eager"] - lp["fused"]).abs().max())
    rows.append(row(GROUP, "fusion update |log-prob fused - eager| max (trainer's recomputation)", lp_diff, "nats",
                    target=f"<= {EQUAL_LOGPROBS}"))
    return rows


def main(argv=None) -> None:
    """One half of the figure alone, written as run_all writes a figure (rows, machine, load before and after)."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from .common import format_table
    from .run_all import machine_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs="+", choices=("decode", "update"), default=["decode", "update"])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default="runs/bench/bench_fusion.json")
    a = ap.parse_args(argv)
    threads = set_threads(a.threads)
    machine = machine_info(threads)
    t0 = time.perf_counter()
    rows = run(a.smoke, threads, tuple(a.part))
    print(format_table(rows))
    out = {"command": "python -m bench.bench_fusion " + " ".join(sys.argv[1:]), "args": vars(a), "machine": machine,
           "figures": {GROUP: {"rows": rows, "seconds": time.perf_counter() - t0,
                               "loadavg_before": machine["loadavg_start"],
                               "loadavg_after": [round(x, 2) for x in os.getloadavg()]}}, "rows": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
