"""The update at long responses, by suffix-pass attention: PrefixDecoder's explicit scores vs the model's own SDPA.

    .venv/bin/python -m bench.bench_update_attention [--rows 64] [--tokens 256] [--budget 18432 4096] [--threads 1]
    .venv/bin/python -m bench.bench_update_attention --profile [--rows 512] [--tokens 256]

The trainer's shared-prefix layout runs each micro-batch's prompts once, then the responses against their KV
(``brorl_lab.rl.logprobs``). For that suffix pass it has two kernels with the same numbers: PrefixDecoder, which
builds [rows, H, W, prompt + W] attention scores (the prompt's KV read once per prompt), and the model's own
attention (SDPA, no scores, the prompt's KV copied to each row). ``logprobs.suffix_in_decoder`` picks the decoder
only for responses of at most ``DECODER_MAX_RESPONSE`` tokens. This times one update (reference forward, policy
forward and backward, AdamW; ``steps.update``) on the long bench's model (``bench/long_model.py``) over P=1 prompt
x ``rows`` fixed-length responses, with the decoder forced (the rule before) and with the rule, at each micro-batch
token budget, round-robin in one process; it prints the median wall and CPU seconds of each and their ratios.

``--profile`` instead answers "what keeps the update under the matmul peak" (issue 30): one update with the rule
(after a warm-up) under torch.profiler, each op's self CPU time in classes (:data:`UPDATE_CLASSES`), and the rate
the matmul ops themselves reach against the measured fp32 matmul peak (``bench_hw.matmul_round``, best
of rounds before and after). The update's share of the peak is then (matmul FLOPs / update wall) / peak = (the
matmuls' own rate / peak) x (the matmuls' share of the wall time).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from .common import (
    bench_items,
    classify_op,
    format_prompts,
    format_table,
    forward_flops,
    median,
    param_counts,
    profile_by_class,
    ratio,
    row,
    set_threads,
)
from .long_model import long_model_path

GROUP = "update_attention"


def long_batch(path: str, rows: int, tokens: int):
    """P=1 prompt x ``rows`` responses of exactly ``tokens`` tokens from the torch engine, with 0/1 rewards."""
    import torch

    from brorl_lab.rollout.engines import RolloutSampling, make_engine

    engine = make_engine("torch", path, device="cpu", dtype="float32")
    try:
        prompts = format_prompts(bench_items(1, seed=0), engine.tokenizer)
        batch = engine.generate(prompts, rows, RolloutSampling(temperature=1.0, top_p=1.0, max_new_tokens=tokens,
                                                               seed=0, ignore_eos=True))
    finally:
        engine.close()
    batch.rewards = torch.randint(0, 2, (batch.size,), generator=torch.Generator().manual_seed(0)).float()
    batch.correct = batch.rewards > 0
    batch.meta["temperature"] = 1.0
    return batch


def update_case(rows: int, tokens: int, budget: int):
    """Everything one update over the long bench's P=1 x ``rows`` batch of ``tokens``-token responses needs:
    ``(batch, policy, cfg, update)``, where ``update(c=cfg)`` runs ``steps.update`` (reference forward, policy
    forward and backward, AdamW) under the Config ``c`` (``cfg``, micro-batch budget ``budget``, or a variant)."""
    import torch

    import brorl_lab.rl.logprobs as LP
    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy, make_reference
    from brorl_lab.rl import steps as S

    path = long_model_path(False)
    batch = long_batch(path, rows, tokens)
    policy, _ = load_policy(path, device="cpu", dtype="float32")
    reference = make_reference(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    cfg = Config(model=path, rollouts_per_prompt=rows, prompts_per_step=1, max_new_tokens=tokens,
                 train_micro_batch_tokens=budget, kl_beta=1e-3, lr=1e-5, eval_every=0)
    adv = S.advantages(batch, "grpo")
    old = LP.compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=budget)

    def update(c=cfg):
        S.update(policy, optimizer, batch, adv, cfg=c, reference=reference, old_logprobs=old)
    return batch, policy, cfg, update


def run(rows: int = 64, tokens: int = 256, budgets=(18432,), repeats: int = 3, threads=None) -> list[dict]:
    import brorl_lab.rl.logprobs as LP

    threads = set_threads(threads)
    _, _, cfg, update = update_case(rows, tokens, budgets[0])
    rule = LP.DECODER_MAX_RESPONSE

    def case(limit, budget):
        c = replace(cfg, train_micro_batch_tokens=budget)

        def go():
            LP.DECODER_MAX_RESPONSE = limit
            try:
                update(c)
            finally:
                LP.DECODER_MAX_RESPONSE = rule
        return go

    cases = {}
    for b in budgets:
        cases[("decoder", b)] = case(10 ** 9, b)
        cases[("rule", b)] = case(rule, b)
    wall, cpu = {k: [] for k in cases}, {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(repeats):
        for k, fn in cases.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    fair = (f"long bench model, P=1 x {rows} rows x {tokens} tokens, kl_beta=1e-3, fp32, {threads} torch threads; "
            f"median of {repeats} round-robin updates after a warm-up, one process")
    base = ("decoder", budgets[0])
    out = []
    for k in cases:
        kind, b = k
        what = "PrefixDecoder forced" if kind == "decoder" else f"suffix_in_decoder (SDPA past {rule} tokens)"
        out.append(row(GROUP, f"update, {what}, budget {b} tokens", median(wall[k]), "s", fairness=fair,
                       note=f"CPU {median(cpu[k]):.3g} s; decoder at budget {budgets[0]} / this: wall "
                            f"{ratio(median(wall[base]), median(wall[k])):.3g}x, CPU "
                            f"{ratio(median(cpu[base]), median(cpu[k])):.3g}x"))
    return out


# torch.profiler op names (self CPU time) -> what the update's time goes to; first match wins
MATMULS = "matmuls (weights, fwd and bwd)"
UPDATE_CLASSES = (
    ("optimizer (AdamW)", ("_foreach", "adamw", "optimizer")),
    (MATMULS, ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "mkldnn")),
    ("attention (SDPA / scores, fwd and bwd)", ("attention", "aten::bmm", "aten::baddbmm", "softmax_backward",
                                                "aten::_softmax", "aten::softmax")),
    ("copies, views, indexing", ("aten::copy_", "aten::cat", "aten::index", "aten::gather", "aten::clone",
                                 "aten::contiguous", "aten::empty", "aten::select", "aten::slice", "aten::stack",
                                 "aten::scatter", "aten::zero", "aten::fill", "aten::as_strided", "aten::view",
                                 "aten::reshape", "aten::transpose", "aten::expand", "aten::narrow")),
)


def classify_update(op: str) -> str:
    return classify_op(op, UPDATE_CLASSES, "elementwise (norms, activations, rope, log-softmax, loss)")


def profile_update(rows: int = 512, tokens: int = 256, budget: int = 18432, threads=None, flops: bool = False) -> list[dict]:
    """One update at ``rows`` x ``tokens`` under torch.profiler: time by op class, and the matmuls' own FLOP rate
    against the measured peak (see the module docstring). The matmuls' FLOPs are the model's (reference forward,
    policy forward and backward: 4 forwards over every response token and each prompt once), or with ``flops`` the
    profiler's own count (which holds every op's inputs: ~100 MB of memory per row at 256 tokens, too much at 512)."""
    from .bench_hw import matmul_round

    threads = set_threads(threads)
    batch, policy, _, update = update_case(rows, tokens, budget)

    peak_round = matmul_round(2048, 3)
    peaks = [peak_round()]
    update()  # warm-up
    secs, flops_by_class, wall = profile_by_class(update, classify_update,
                                                  "outside ops (Python, autograd engine, dispatch)", with_flops=flops)
    peaks.append(peak_round())
    peak = max(peaks)
    mm_secs, mm_flops = secs.get(MATMULS, 0.0), flops_by_class.get(MATMULS, 0.0)
    count = "profiler count"
    if not flops:
        fed = sum(len(x) for x in batch.prompt_ids) + int(batch.lengths.sum())
        mm_flops, count = 4 * forward_flops(param_counts(policy), fed, int(batch.lengths.sum())), "model FLOPs"
    fair = (f"long bench model, P=1 x {rows} rows x {tokens} tokens, budget {budget} tokens, fp32, {threads} torch "
            f"threads; one update after a warm-up, profiled (profiler overhead included in the wall time)")
    out = [row(GROUP, f"update profile: {name}", 100 * sec / wall, "% time", fairness=fair, note=f"{sec:.3g} s")
           for name, sec in sorted(secs.items(), key=lambda kv: -kv[1])]
    out.append(row(GROUP, "update profile: wall time", wall, "s", fairness=fair))
    out.append(row(GROUP, "fp32 matmul peak (n=2048, best of rounds before and after)", peak / 1e9, "GFLOP/s"))
    out.append(row(GROUP, "matmul ops' own rate / peak", 100 * ratio(mm_flops / max(mm_secs, 1e-9), peak),
                   "% peak", note=f"{mm_flops / 1e9:.4g} GFLOP ({count}) in {mm_secs:.3g} s of self time"))
    out.append(row(GROUP, "update: matmul FLOPs / wall / peak", 100 * ratio(mm_flops / wall, peak), "% peak",
                   note="= the matmuls' own rate / peak x their share of the wall time"))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--budget", type=int, nargs="+", default=[18432], help="micro-batch token budgets")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    ap.add_argument("--profile", action="store_true",
                    help="profile one update at --rows x --tokens (first --budget) instead: time by op class, the "
                         "matmuls' own rate against the peak")
    ap.add_argument("--flops", action="store_true", help="with --profile: the profiler counts the matmuls' FLOPs "
                    "(memory grows ~100 MB per row) instead of the model's FLOP count")
    args = ap.parse_args(argv)
    if args.profile:
        print(format_table(profile_update(args.rows, args.tokens, args.budget[0], args.threads, args.flops)))
        return
    print(format_table(run(args.rows, args.tokens, tuple(args.budget), args.repeats, args.threads)))


if __name__ == "__main__":
    main()
