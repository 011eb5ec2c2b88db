"""The update at long responses, by suffix-pass attention: PrefixDecoder's explicit scores vs the model's own SDPA.

    .venv/bin/python -m bench.bench_update_attention [--rows 64] [--tokens 256] [--budget 18432 4096] [--threads 1]

The trainer's shared-prefix layout runs each micro-batch's prompts once, then the responses against their KV
(``brorl_lab.rl.logprobs``). For that suffix pass it has two kernels with the same numbers: PrefixDecoder, which
builds [rows, H, W, prompt + W] attention scores (the prompt's KV read once per prompt), and the model's own
attention (SDPA, no scores, the prompt's KV copied to each row). ``logprobs.suffix_in_decoder`` picks the decoder
only for responses of at most ``DECODER_MAX_RESPONSE`` tokens. This times one update (reference forward, policy
forward and backward, AdamW; ``steps.update``) on the long bench's model (``bench/long_model.py``) over P=1 prompt
x ``rows`` fixed-length responses, with the decoder forced (the rule before) and with the rule, at each micro-batch
token budget, round-robin in one process; it prints the median wall and CPU seconds of each and their ratios.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from .common import bench_items, format_prompts, format_table, median, ratio, row, set_threads
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


def run(rows: int = 64, tokens: int = 256, budgets=(18432,), repeats: int = 3, threads=None) -> list[dict]:
    import torch

    import brorl_lab.rl.logprobs as LP
    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy, make_reference
    from brorl_lab.rl import steps as S

    threads = set_threads(threads)
    path = long_model_path(False)
    batch = long_batch(path, rows, tokens)
    policy, _ = load_policy(path, device="cpu", dtype="float32")
    reference = make_reference(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    cfg = Config(model=path, rollouts_per_prompt=rows, prompts_per_step=1, max_new_tokens=tokens,
                 train_micro_batch_tokens=budgets[0], kl_beta=1e-3, lr=1e-5, eval_every=0)
    adv = S.advantages(batch, "grpo")
    old = LP.compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=budgets[0])
    rule = LP.DECODER_MAX_RESPONSE

    def case(limit, budget):
        c = replace(cfg, train_micro_batch_tokens=budget)

        def go():
            LP.DECODER_MAX_RESPONSE = limit
            try:
                S.update(policy, optimizer, batch, adv, cfg=c, reference=reference, old_logprobs=old)
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--budget", type=int, nargs="+", default=[18432], help="micro-batch token budgets")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    args = ap.parse_args(argv)
    print(format_table(run(args.rows, args.tokens, tuple(args.budget), args.repeats, args.threads)))


if __name__ == "__main__":
    main()
