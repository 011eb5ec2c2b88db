"""The per-token step fused by ``torch.compile`` (inductor) against the eager step, side by side in one process.

    .venv/bin/python -m bench.run_all --only fusion [--smoke] [--json PATH]

Decode: the torch engine's shared-prefix rollout on the long bench's model (``bench/long_model.py``) at P=1 x N
rows of ``new_tokens`` fixed-length tokens, ``TorchEngine(compile_decode=False)`` (eager: every op of the step
dispatched from Python) against ``compile_decode=True`` (the step compiled once with dynamic shapes; norms, RoPE,
SwiGLU, residual adds and the attention softmax fused into C++ loops). Both engines are built and warmed up first
(the fused one's first call pays the compile, reported on its own row), then timed A, B, A, B, ... so load from
the other users of the machine lands on both alike; the figure is the median of the per-pair time ratios.

Numerical equality, checked in the same run: near-greedy decoding (top_p = 1e-6 keeps only the argmax token) gives
identical tokens, and the same seed gives the same sampled tokens with log-probs within 1e-5 (the rows say how far
apart they are). The engine's default follows these rows (``docs/benchmarks.md``).
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


FULL = Size(n=512, new_tokens=256, repeats=3, check_tokens=32)
SMOKE = Size(n=8, new_tokens=8, repeats=1, check_tokens=6)


def run(smoke: bool = False, threads=None) -> list[dict]:
    import torch

    from brorl_lab.rollout.engines import RolloutSampling
    from brorl_lab.rollout.engines.torch_engine import TorchEngine

    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    path = long_model_path(smoke)
    engines = {"eager": TorchEngine(path, device="cpu", dtype="float32"),
               "fused": TorchEngine(path, device="cpu", dtype="float32", compile_decode=True)}
    prompts = format_prompts(bench_items(1, seed=0), engines["eager"].tokenizer)

    def sampling(tokens, seed, top_p=1.0):
        return RolloutSampling(temperature=1.0, top_p=top_p, max_new_tokens=tokens, seed=seed, ignore_eos=True)

    first = {}
    for name, engine in engines.items():  # warm-up; the fused engine's first call compiles its step
        t0 = time.perf_counter()
        engine.generate(prompts, size.n, sampling(size.new_tokens, 0))
        first[name] = time.perf_counter() - t0
    # equality: near-greedy tokens, and same-seed sampled tokens and log-probs
    greedy = {k: e.generate(prompts, size.n, sampling(size.check_tokens, 1, 1e-6)) for k, e in engines.items()}
    sampled = {k: e.generate(prompts, size.n, sampling(size.check_tokens, 2)) for k, e in engines.items()}
    greedy_equal = torch.equal(greedy["eager"].response_ids, greedy["fused"].response_ids)
    sampled_equal = torch.equal(sampled["eager"].response_ids, sampled["fused"].response_ids)
    lp_diff = float((sampled["eager"].logprobs - sampled["fused"].logprobs).abs().max())

    load_before = os.getloadavg()[0]
    seconds = {k: [] for k in engines}
    for i in range(size.repeats):
        order = list(engines) if i % 2 == 0 else list(engines)[::-1]  # A B, B A, ...: neither side always first
        for name in order:
            t0 = time.perf_counter()
            engines[name].generate(prompts, size.n, sampling(size.new_tokens, 10 + i))
            seconds[name].append(time.perf_counter() - t0)
    load_after = os.getloadavg()[0]
    for e in engines.values():
        e.close()

    pairs = [f / e for e, f in zip(seconds["eager"], seconds["fused"])]
    fair = (f"long bench model, P=1 x N={size.n} rows x {size.new_tokens} tokens (EOS ignored), T=1.0, top_p=1, "
            f"fp32, {threads} torch threads, one process; {size.repeats} interleaved pair(s) (order alternating) "
            f"after a full-length warm-up call each; 1-min load average {load_before:.2f} before, "
            f"{load_after:.2f} after")
    rows = []
    for name in engines:
        rows.append(row(GROUP, f"fusion decode {name} N={size.n} ({size.new_tokens} tokens)",
                        median(seconds[name]), "s", fairness=fair,
                        note="calls: " + ", ".join(f"{s:.3g}" for s in seconds[name])))
    rows.append(row(GROUP, f"fusion decode fused/eager time N={size.n}", median(pairs), "x", fairness=fair,
                    note="median of per-pair ratios " + ", ".join(f"{p:.3g}" for p in pairs)
                         + "; < 1: the fused step is faster"))
    rows.append(row(GROUP, "fusion decode fused first call (compile) - eager first call",
                    first["fused"] - first["eager"], "s",
                    note=f"one-time per process: first calls {first['fused']:.3g} s fused, {first['eager']:.3g} s "
                         "eager (inductor's on-disk cache shortens later processes' compile)"))
    rows.append(row(GROUP, f"fusion decode near-greedy tokens identical ({size.check_tokens} tokens)",
                    float(greedy_equal), "bool", target=">= 1"))
    rows.append(row(GROUP, f"fusion decode sampled tokens identical, same seed ({size.check_tokens} tokens)",
                    float(sampled_equal), "bool"))
    rows.append(row(GROUP, "fusion decode |log-prob fused - eager| max", lp_diff, "nats",
                    target=f"<= {EQUAL_LOGPROBS}"))
    return rows


if __name__ == "__main__":
    from .common import format_table

    print(format_table(run()))
