"""Figure 4, memory: peak RSS of one update step (old logprobs, reference logprobs, PPO-clip + KL loss, backward,
AdamW) at N in {16, 64, 256, 512} with P prompts fixed and a fixed micro-batch token budget. The child also times
the update and counts its model FLOPs (``bench_long`` reads its MFU from them).

    .venv/bin/python -m bench.run_all --only memory [--smoke]

The batches are sampled here with the torch engine and handed to one fresh subprocess per N, which loads the
policy, the reference and the batch, records its RSS, runs the update and reports its peak RSS (``VmHWM``;
``ru_maxrss`` would include this parent's RSS, see ``common.peak_rss_mib``). Memory is set by the micro-batch,
not by P*N, so peak RSS should stay nearly flat in N; the ratios are to the smallest N.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .bench_hw import layout_tokens
from .common import bench_items, child_main, forward_flops, model_path, param_counts, ratio, row, rss_mib, run_child, set_threads

GROUP = "memory"
MODULE = "bench.bench_memory"


@dataclass(frozen=True)
class Size:
    P: int
    ns: tuple
    max_new_tokens: int
    micro_batch_tokens: int


# P is large enough that even N=16 fills several micro-batches: the ratio then measures growth with N, not the
# smallest batch under-filling its first micro-batch (P=2 x N=16 at 2048 tokens did, and read as 1.3x growth; so
# did P=4 once the shared-prefix plan counted each prompt once per micro-batch).
FULL = Size(P=16, ns=(16, 64, 256, 512), max_new_tokens=16, micro_batch_tokens=1024)
SMOKE = Size(P=2, ns=(4, 16), max_new_tokens=4, micro_batch_tokens=64)


def child(p: dict) -> dict:
    import torch

    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy, make_reference
    from brorl_lab.rl import steps as S
    from brorl_lab.rl.logprobs import compute_logprobs, plan_micro_batches

    policy, _ = load_policy(p["model"], device="cpu", dtype="float32")
    reference = make_reference(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    batch = torch.load(p["batch"], weights_only=False)
    cfg = Config(model=p["model"], rollouts_per_prompt=batch.n, prompts_per_step=batch.num_prompts,
                 max_new_tokens=p["max_new_tokens"], train_micro_batch_tokens=p["micro_batch_tokens"], kl_beta=1e-3,
                 lr=1e-5, eval_every=0)
    adv = S.advantages(batch, "grpo")
    before = rss_mib()
    old = compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=cfg.train_micro_batch_tokens)
    t0 = time.perf_counter()
    S.update(policy, optimizer, batch, adv, cfg=cfg, reference=reference, old_logprobs=old)
    seconds = time.perf_counter() - t0
    fed, layout = layout_tokens(policy, batch, cfg)  # model FLOPs as bench_hw counts them (4 forwards' worth)
    flops = 4 * forward_flops(param_counts(policy), fed, int(batch.lengths.sum()))
    return {"rss_before_mib": before, "samples": batch.size, "tokens": int(batch.lengths.sum()),
            "update_seconds": seconds, "update_flops": flops, "layout": layout, "tokens_fed": fed,
            "micro_batches": len(plan_micro_batches(policy, batch, torch.arange(batch.size),
                                                    cfg.train_micro_batch_tokens, cfg.logprob_layout))}


def run(smoke: bool = False, threads=None) -> list[dict]:
    import tempfile

    import torch

    from brorl_lab.rl import steps as S
    from brorl_lab.rollout.engines import RolloutSampling, make_engine

    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    path = model_path()
    items = bench_items(size.P, seed=2)
    results = {}
    with tempfile.TemporaryDirectory(prefix="brorl_bench_mem_") as tmp:
        engine = make_engine("torch", path, device="cpu", dtype="float32")
        files = {}
        try:
            for n in size.ns:
                batch = S.score(S.rollout(engine, items, n, RolloutSampling(max_new_tokens=size.max_new_tokens,
                                                                            seed=n)))
                batch.meta["temperature"] = 1.0
                files[n] = Path(tmp) / f"batch_{n}.pt"
                torch.save(batch, files[n])
        finally:
            engine.close()
        for n in size.ns:
            results[n] = run_child(MODULE, {"model": path, "batch": str(files[n]), "max_new_tokens":
                                            size.max_new_tokens, "micro_batch_tokens": size.micro_batch_tokens},
                                   threads=threads)
    lo, hi = min(size.ns), max(size.ns)
    fair = (f"P={size.P} prompts, micro-batch {size.micro_batch_tokens} tokens, max_new_tokens={size.max_new_tokens},"
            f" kl_beta=1e-3 (reference loaded), fp32, {threads} threads; one subprocess per N, peak = VmHWM of the child")
    rows = []
    for n in size.ns:
        r = results[n]
        rows.append(row(GROUP, f"update peak RSS N={n} ({r['samples']} samples)", r["peak_rss_mib"], "MiB",
                        note=f"{r['peak_rss_mib'] - r['rss_before_mib']:.0f} MiB above the pre-update RSS "
                             f"({r['rss_before_mib']:.0f} MiB: model, reference, batch); {r['micro_batches']} "
                             "micro-batches per pass", fairness=fair))
    for n in size.ns:
        if n == lo:
            continue
        r, r0 = results[n], results[lo]
        rows.append(row(GROUP, f"update peak RSS N={n} / N={lo}", ratio(r["peak_rss_mib"], r0["peak_rss_mib"]), "x",
                        target="<= 1.2" if n == hi and not smoke else None, fairness=fair,
                        note=f"increment over pre-update RSS: "
                             f"{ratio(r['peak_rss_mib'] - r['rss_before_mib'], r0['peak_rss_mib'] - r0['rss_before_mib']):.2f}x"))
    return rows


if __name__ == "__main__":
    child_main(child)
