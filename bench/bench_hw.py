"""Figure 2, hardware efficiency: this machine's fp32 matmul peak, measured in the same run, and the rollout,
logprob and update stages as a fraction of it (model FLOPs utilisation, MFU).

    .venv/bin/python -m bench.run_all --only hw [--smoke]

Peak: ``torch.matmul`` of two random n x n fp32 matrices (2 n^3 FLOPs), the best call of every round. The stages
run at N=512 on the default model, interleaved with the matmul rounds (matmul, rollout, logprobs, update, matmul,
...), and their MFU is model FLOPs / median stage time / best peak (see bench/common.py for the FLOP count):

    rollout   torch engine, P prompts x N: 2 * body * (P * prompt_len + decode steps) + LM head on sampled tokens
    logprobs  compute_logprobs (no grad): 2 * body * tokens fed + LM head on response tokens
    update    steps.update with old logprobs given: reference forward (2x) + policy forward and backward (6x)

"Tokens fed" are the real tokens the trainer's logprob layout puts through the model (``layout_tokens``): with
the default shared-prefix layout each micro-batch's distinct prompts once plus every row's response, not the
prompt once per row. Work the layout avoids is not counted as done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .common import (
    bench_items,
    format_prompts,
    forward_flops,
    interleave,
    median,
    model_path,
    param_counts,
    ratio,
    row,
    set_threads,
)

GROUP = "hw"


@dataclass(frozen=True)
class Size:
    matmul_n: int
    matmul_calls: int  # per round; the best call counts
    n: int  # rollouts per prompt
    total: int  # samples (P = total / n)
    max_new_tokens: int
    micro_batch_tokens: int
    repeats: int


FULL = Size(matmul_n=2048, matmul_calls=3, n=512, total=512, max_new_tokens=16, micro_batch_tokens=8192, repeats=9)
SMOKE = Size(matmul_n=256, matmul_calls=2, n=16, total=32, max_new_tokens=6, micro_batch_tokens=512, repeats=1)


def best_rate(op, work: float, calls: int):
    """A timed round for :func:`~bench.common.interleave`: runs ``op()`` ``calls`` times and returns ``work`` per
    second of the fastest call (the machine's peak, as near as a short burst gets)."""
    def go() -> float:
        import time

        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            op()
            best = min(best, time.perf_counter() - t0)
        return work / best
    return go


def matmul_round(n: int, calls: int):
    """The fp32 matmul peak: ``torch.matmul`` of two random n x n matrices, in FLOP/s (2 n^3 per call)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return best_rate(lambda: torch.matmul(a, b), 2.0 * n ** 3, calls)


def stream_round(mib: int, calls: int):
    """This machine's memory bandwidth: a copy of a ``mib`` MiB fp32 tensor, in bytes moved per second (read and
    write: 2 x its size). Decode reads the whole KV cache for every token, so its time has a floor of bytes read /
    this bandwidth, as it has one of model FLOPs / the matmul peak."""
    import torch

    src = torch.randn(mib * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    return best_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, calls)


def layout_tokens(policy, batch, cfg) -> tuple[int, str]:
    """(real tokens one logprob pass over ``batch`` feeds through the model, the layout used)."""
    import torch

    from brorl_lab.rl.logprobs import _plain_kv_cache, plan_micro_batches, row_token_counts

    groups = plan_micro_batches(policy, batch, torch.arange(batch.size), cfg.train_micro_batch_tokens,
                                cfg.logprob_layout)
    if cfg.logprob_layout == "packed" or _plain_kv_cache(policy) is None:
        return int(row_token_counts(batch).sum()), "packed"
    fed = 0
    for g in groups:
        prompts = torch.unique(g // batch.n).tolist()
        if len(prompts) == len(g) and cfg.logprob_layout == "auto":  # nothing shared: packed for this group
            fed += int(row_token_counts(batch)[g].sum())
        else:
            fed += sum(len(batch.prompt_ids[p]) for p in prompts) + int(batch.lengths[g].sub(1).clamp(min=0).sum())
    return fed, cfg.logprob_layout if cfg.logprob_layout != "auto" else "shared_prefix"


def run(smoke: bool = False, threads=None) -> list[dict]:
    import torch

    from brorl_lab.core.config import Config
    from brorl_lab.core.models import load_policy, make_reference
    from brorl_lab.rl import steps as S
    from brorl_lab.rl.logprobs import compute_logprobs
    from brorl_lab.rollout.engines import RolloutSampling, make_engine

    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    path = model_path()
    policy, tok = load_policy(path, device="cpu", dtype="float32")
    reference = make_reference(policy)
    counts = param_counts(policy)
    engine = make_engine("torch", policy, tok, device="cpu", dtype="float32")
    P = size.total // size.n
    items = bench_items(P, seed=1)
    prompts = format_prompts(items, tok)
    sampling = RolloutSampling(temperature=1.0, top_p=1.0, max_new_tokens=size.max_new_tokens, seed=0)
    cfg = Config(model=path, rollouts_per_prompt=size.n, prompts_per_step=P, max_new_tokens=size.max_new_tokens,
                 train_micro_batch_tokens=size.micro_batch_tokens, kl_beta=1e-3, lr=1e-5, eval_every=0)
    batch = S.score(S.rollout(engine, items, size.n, sampling), template="plain")
    batch.meta["temperature"] = 1.0
    adv = S.advantages(batch, "grpo")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    old = compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=cfg.train_micro_batch_tokens)

    prompt_len = sum(len(x) for x in batch.prompt_ids) * batch.n  # prompt tokens over all rows
    resp = int(batch.lengths.sum())
    fed, layout = layout_tokens(policy, batch, cfg)
    fwd = forward_flops(counts, fed, resp)  # one forward over the real tokens the layout feeds
    packed_cfg = replace(cfg, logprob_layout="packed")  # the ablation: the prompt once per row
    packed_fwd = forward_flops(counts, layout_tokens(policy, batch, packed_cfg)[0], resp)

    def rollout():
        b = engine.generate(prompts, size.n, sampling)
        decode = int((b.lengths - 1).clamp(min=0).sum())
        pre = sum(len(x) for x in b.prompt_ids)
        return forward_flops(counts, pre + decode, len(prompts) + decode)

    cases = {
        "matmul": matmul_round(size.matmul_n, size.matmul_calls),
        "rollout": rollout,
        "logprobs": lambda: compute_logprobs(policy, batch, temperature=1.0,
                                             micro_batch_tokens=cfg.train_micro_batch_tokens),
        "update": lambda: S.update(policy, optimizer, batch, adv, cfg=cfg, reference=reference, old_logprobs=old),
        "update_packed": lambda: S.update(policy, optimizer, batch, adv, cfg=packed_cfg, reference=reference,
                                          old_logprobs=old),
    }
    try:
        seconds, results = interleave(cases, size.repeats)
    finally:
        engine.close()
    peak = max(results["matmul"])
    rollout_flops = median(results["rollout"])
    stage = {"rollout": rollout_flops / median(seconds["rollout"]),
             "logprobs": fwd / median(seconds["logprobs"]),
             "update": 4 * fwd / median(seconds["update"]),  # reference forward (1x) + policy fwd+bwd (3x)
             "update_packed": 4 * packed_fwd / median(seconds["update_packed"])}
    fair = (f"peak: best of {size.repeats}x{size.matmul_calls} fp32 matmuls n={size.matmul_n}; stages: median of "
            f"{size.repeats}, interleaved with the matmul rounds; {threads} torch threads; body params "
            f"{counts[0]:,}, LM head {counts[1]:,}; attention FLOPs and padding not counted")
    shape = f"N={size.n}, P={P}, {resp / batch.size:.1f} response + {prompt_len / batch.size:.1f} prompt tokens/row"
    note = f"{shape}; {layout} layout feeds {fed / batch.size:.1f} tokens/row"
    packed_note = f"{shape}; packed layout feeds {(prompt_len + resp) / batch.size:.1f} tokens/row"
    rows = [row(GROUP, f"fp32 matmul peak (n={size.matmul_n}, best)", peak / 1e9, "GFLOP/s", fairness=fair,
                note=f"median round {median(results['matmul']) / 1e9:.1f} GFLOP/s")]
    targets = {"update": ">= 25" if size.n == 512 else None}
    what = {"rollout": "rollout (torch engine)", "logprobs": "logprobs forward (no grad)",
            "update": "update (ref fwd + policy fwd/bwd + AdamW)",
            "update_packed": "update, logprob_layout='packed' (ablation)"}
    for key in ("rollout", "logprobs", "update", "update_packed"):
        rows.append(row(GROUP, f"{what[key]} N={size.n}", stage[key] / 1e9, "GFLOP/s",
                        note=packed_note if key == "update_packed" else note, fairness=fair))
        rows.append(row(GROUP, f"{what[key]} N={size.n} MFU", 100 * ratio(stage[key], peak), "% peak",
                        target=targets.get(key), note=f"{median(seconds[key]):.3g} s per call", fairness=fair))
    return rows
