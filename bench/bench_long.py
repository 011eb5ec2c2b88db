"""The long-response figure: the shape of a reasoning model, where generation and the KV cache decide.

    .venv/bin/python -m bench.run_all --only long [--smoke]

Model: the default architecture scaled to a few million parameters, random weights (``bench/long_model.py``);
every response is forced to ``new_tokens`` (``RolloutSampling(ignore_eos=True)``; TRL: ``min_new_tokens``).
N in {16, 64, 512} at a fixed total of samples per call (P = total / N prompts). Figures, side by side in one run:

    rollout  samples/s and tokens/s of the torch engine, transformers ``generate`` (hf) and vllm(-cpu), timed
             round-robin with fp32 matmul rounds (the peak); the N=512 / N=16 samples/s ratio (BroRL: 1.98x)
    decode   the torch engine's rollout at N=512 as a fraction of the matmul peak (MFU), and a torch.profiler
             profile of one such call: the share of its wall time in weight matmuls, attention over the KV cache,
             KV copies, sampling, other ops, and outside any op (Python and dispatch: per-token overhead)
    roofline the least time this machine allows (:func:`decode_roofline`): model FLOPs at the measured matmul
             peak plus the KV cache decode must read at the measured copy bandwidth; from it, the largest
             torch/hf ratio and the smallest step/TRL ratio any implementation could reach here. The decode's
             share of its roofline is measured in ``pairs`` (3) calls at the largest N, each between two copy
             rounds and after a matmul round: each call against the bandwidth and peak measured beside it (the
             median and the spread are reported), so a load that changes during the run moves both sides alike
    attention decode attention alone against its memory roofline: the profiled call's attention time against its KV
             bytes at the copy bandwidth, and the kernel alone at N=512 rows with candidate kernels beside it
             (``bench/bench_decode_attention.py``: engine, transposed keys, SDPA, a plain read of the same KV)
    step     one full RL step at N=512, brorl_lab Trainer vs TRL GRPOTrainer (``bench_step_trl``, same config),
             and the Trainer with ``Config(compile_step=True)`` beside them (issue 35)
    fused    decode and its profile again with the torch engine's decode step compiled (``compile_decode=True``,
             warmed up before the timed calls), timed round-robin with the rest (issue 35)
    update   one update (old + reference log-probs, PPO-clip + KL, backward, AdamW) at P=1 x N=16 and x N=512,
             each in a fresh subprocess (``bench_memory.child``): peak RSS (VmHWM) and the update's MFU

Attention-score FLOPs are not in the model FLOPs (see ``bench/common.py``); at long contexts they are a larger
share (``4 * context * D`` per token and layer), which the profile's attention row shows as time.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import bench_decode_attention, bench_memory, bench_step_trl
from .bench_hw import matmul_round, stream_round
from .bench_rollout import BRORL_GPU_SCALING, available_engines, start_engines
from .common import (
    bench_items,
    classify_op,
    format_prompts,
    forward_flops,
    interleave,
    median,
    param_counts,
    profile_by_class,
    ratio,
    row,
    run_child,
    set_threads,
)
from .long_model import long_model_path, param_total

GROUP = "long"
# issue 30's targets (the step's was 0.33x before it; the decode roofline share is new there)
TARGETS = {"torch/hf": ">= 3", "torch/vllm": ">= 1", "step": "<= 0.4", "rss": "<= 1.2", "decode roofline": ">= 65"}


@dataclass(frozen=True)
class Size:
    total: int  # samples per generate call
    ns: tuple  # N values; the smallest and largest are compared
    new_tokens: int  # every response's length
    repeats: int  # interleaved timed calls per (engine, N)
    matmul_n: int
    micro_batch_tokens: int  # update and step token budget
    step_micro_batch: int  # TRL per_device_train_batch_size (samples)
    profile_tokens: int  # response length of the profiled decode call
    stream_mib: int  # size of the tensor copied to measure memory bandwidth
    attn_repeats: int  # round-robin repetitions of the decode-attention kernels (bench_decode_attention)
    pairs: int = 3  # decode calls at the largest N per engine (eager, fused), each between two copy rounds


# new_tokens: 256 fixed-length tokens (~70x the short regime's 3-4-token answers; the GPU check runs 256 too)
# makes the long figure ~14 minutes on a 2-core CPU machine, one call per engine and N; the profile is of a whole
# call, so attention over a KV cache that grows to the full length is weighed as it is in the timed call.
FULL = Size(total=512, ns=(16, 64, 512), new_tokens=256, repeats=1, matmul_n=1024, micro_batch_tokens=1024,
            step_micro_batch=64, profile_tokens=256, stream_mib=256, attn_repeats=5)
SMOKE = Size(total=16, ns=(4, 16), new_tokens=8, repeats=1, matmul_n=128, micro_batch_tokens=64,
             step_micro_batch=8, profile_tokens=4, stream_mib=8, attn_repeats=1)

# torch.profiler op names (self CPU time) -> what the decode time goes to
PROFILE_CLASSES = (
    ("fused kernels (torch.compile)", ("compiled",)),  # a compiled region's self time: its fused C++ loops
    ("weight matmuls", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_mkldnn", "mkldnn")),
    ("attention over the KV cache", ("attention", "aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::softmax")),
    ("KV and row copies", ("aten::copy_", "aten::cat", "aten::index", "aten::gather", "aten::clone",
                           "aten::contiguous", "aten::empty", "aten::select", "aten::slice", "aten::stack")),
    ("sampling", ("aten::multinomial", "aten::sort", "aten::cumsum", "aten::log_softmax", "aten::_log_softmax",
                  "aten::exponential", "aten::argmax", "aten::isin", "aten::where")),
)


def classify(op: str) -> str:
    return classify_op(op, PROFILE_CLASSES, "other ops (norms, activations)")


def profile_call(fn) -> tuple[dict, float]:
    """``({class: seconds}, wall seconds)`` of ``fn()`` under torch.profiler: each op's self CPU time, classified by
    :func:`classify`; the wall time no op accounts for is "outside ops (Python, dispatch)"."""
    secs, _, wall = profile_by_class(fn, classify, "outside ops (Python, dispatch)")
    return secs, wall


def kv_bytes_per_token(cfg) -> int:
    """Bytes of KV cache one token holds in fp32: layers x (key + value) x KV heads x head_dim x 4."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4


def decode_flops(batch, counts) -> float:
    """Model FLOPs of a rollout of ``batch``: the prompts once, then the tokens each row feeds back (all but its
    last), with logits at each prompt's last token and at every fed token."""
    fed = int(batch.lengths.sum()) - batch.size
    return forward_flops(counts, sum(len(x) for x in batch.prompt_ids) + fed, batch.num_prompts + fed)


def decode_roofline(batch, cfg, counts, peak: float, bandwidth: float) -> dict:
    """The least time a rollout of ``batch`` (P prompts x N rows, every row T tokens) can take on this machine,
    whatever the implementation, from two measured ceilings:

        t >= F / peak + B / bandwidth
        F = model FLOPs: the prompts once, then the T - 1 tokens each row feeds back  (:func:`decode_flops`)
        B = KV bytes read: at fed token j = 1 .. T-1 each row reads its own j cached tokens and each prompt's
            prefix is read once (shared by its rows):  bytes/token x (R T (T-1) / 2 + (T-1) sum_p L_p)

    Attention FLOPs, norms, sampling and Python are left out, so this is a floor, not an estimate. Returns
    ``{"seconds", "flop_seconds", "kv_gb"}``."""
    T, R = int(batch.lengths.max()), batch.size
    prompt_tokens = sum(len(x) for x in batch.prompt_ids)
    flops = decode_flops(batch, counts)
    kv = kv_bytes_per_token(cfg) * (R * T * (T - 1) / 2 + (T - 1) * prompt_tokens)
    return {"seconds": flops / peak + kv / bandwidth, "flop_seconds": flops / peak, "kv_gb": kv / 1e9}


def decode_pairs(calls: dict, size: Size) -> dict[str, list[dict]]:
    """``size.pairs`` rounds of each decode call in ``calls`` ({engine: call}), round-robin, each call after a
    matmul round and between two copy rounds: per engine a list of ``{"seconds", "batch", "peak", "bandwidth"}``,
    the bandwidth the mean of the copy rounds just before and just after that call. A call's roofline share is then
    taken against the machine as it was during that call, not against the best round of the whole run."""
    import time

    peak_round, copy_round = matmul_round(size.matmul_n, 3), stream_round(size.stream_mib, 3)
    out: dict[str, list[dict]] = {e: [] for e in calls}
    for _ in range(size.pairs):
        for engine, call in calls.items():
            peak, before = peak_round(), copy_round()
            t0 = time.perf_counter()
            batch = call()
            seconds = time.perf_counter() - t0
            out[engine].append({"seconds": seconds, "batch": batch, "peak": peak,
                                "bandwidth": (before + copy_round()) / 2})
    return out


def update_floor_seconds(batch, counts, peak: float) -> float:
    """The least time one update over ``batch`` can take at the matmul peak: reference forward plus policy forward
    and backward, 4 forwards' worth of model FLOPs over each prompt once and every response token."""
    responses = int(batch.lengths.sum())
    fed = sum(len(x) for x in batch.prompt_ids) + responses
    return 4 * forward_flops(counts, fed, responses) / peak


def run(smoke: bool = False, threads=None) -> list[dict]:  # noqa: C901 - one benchmark regime measured top to bottom, each peer timed in turn
    import torch

    from brorl_lab.rollout.engines import RolloutSampling

    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    path = long_model_path(smoke)
    names = available_engines()
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    attn_size = bench_decode_attention.Size(  # decode attention alone at this figure's largest N, one layer
        rows=size.total, prompts=size.total // max(size.ns), kv_heads=kv_heads, group=heads // kv_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, prefix=24, T=size.new_tokens,
        lengths=tuple(range(size.new_tokens // 8, size.new_tokens, size.new_tokens // 4)), repeats=size.attn_repeats,
        stream_mib=size.stream_mib)
    # vllm's KV cache holds every row of a call at once (its 1 GiB CPU default would queue some at N=512)
    kv_gib = 1.25 * size.total * cfg.max_position_embeddings * kv_bytes_per_token(cfg) / 2 ** 30
    built, start_s = start_engines(path, names, threads, cfg.max_position_embeddings, kv_cache_gib=kv_gib,
                                   eager=smoke)
    lo, hi = min(size.ns), max(size.ns)
    try:
        tok = built["torch"].tokenizer
        pool = format_prompts(bench_items(size.total // lo, seed=0), tok)
        seeds = iter(range(10**6))

        def sampling(tokens=size.new_tokens):
            return RolloutSampling(temperature=1.0, top_p=1.0, max_new_tokens=tokens, seed=next(seeds),
                                  ignore_eos=True)

        from brorl_lab.rollout.engines import make_engine

        built["torch-fused"] = make_engine("torch", path, device="cpu", dtype="float32", compile_decode=True)
        for engine in built.values():  # a short untimed warm-up each (a full-length one would double the figure)
            engine.generate(pool[:2], 2, sampling(4))
        built["torch-fused"].generate(pool[:1], 2, sampling(4))  # torch.compile specialises P=1 (N=512's P)
        torch.set_num_threads(threads)

        def case(engine, n):
            return lambda: engine.generate(pool[: size.total // n], n, sampling())

        cases = {"matmul": matmul_round(size.matmul_n, 3), "stream": stream_round(size.stream_mib, 3)}
        cases.update({(name, n): case(built[name], n) for n in size.ns for name in names})
        seconds, results = interleave(cases, size.repeats, warmup=False)
        pairs = decode_pairs({e: case(built[e], hi) for e in ("torch", "torch-fused")}, size)
        torch_model = built["torch"].model
        counts = param_counts(torch_model)
        prof_shares, prof_wall = profile_call(lambda: built["torch"].generate(pool[: size.total // hi], hi,
                                                                               sampling(size.profile_tokens)))
        fused_shares, fused_wall = profile_call(lambda: built["torch-fused"].generate(
            pool[: size.total // hi], hi, sampling(size.profile_tokens)))
        big_batch = results[("torch", hi)][-1]
    finally:
        for e in built.values():
            e.close()
    # The peak and the bandwidth are the best this run saw: the rounds between the rollouts, more rounds once the
    # engines are closed, and the decode-attention bench's copy rounds. A single round can read low (on 2026-12-05
    # one read 13.9 GB/s where every other copy in the run read 21), and a low bandwidth flatters the roofline share.
    _, extra = interleave({"matmul": cases["matmul"], "stream": cases["stream"]}, 3, warmup=False)
    attn = bench_decode_attention.measure(attn_size)
    peak = max(results["matmul"] + extra["matmul"] + [p["peak"] for e in pairs.values() for p in e])
    bandwidth = max(results["stream"] + extra["stream"] + [attn["copy_gbps"] * 1e9]
                    + [p["bandwidth"] for e in pairs.values() for p in e])

    sps, tps = {}, {}
    for key in cases:
        if key in ("matmul", "stream"):
            continue
        sps[key] = median([b.size / t for b, t in zip(results[key], seconds[key])])
        tps[key] = median([int(b.lengths.sum()) / t for b, t in zip(results[key], seconds[key])])
    params = param_total(path)
    shape = (f"{params / 1e6:.1f}M-param random Qwen2 (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers), "
             f"{size.new_tokens} new tokens per response (EOS ignored)")
    fair = (f"{shape}; same prompts, N, T=1.0, top_p=1, no top-k, fp32, {threads} torch threads, one process; "
            f"median of {size.repeats} round-robin call(s) per engine and N after a short warm-up")
    rows = []
    for n in size.ns:
        P = size.total // n
        for name in names:
            full = all(bool((b.lengths == size.new_tokens).all()) for b in results[(name, n)])
            rows.append(row(GROUP, f"long rollout {name} N={n} (P={P})", sps[(name, n)], "samples/s",
                            note=f"{median(seconds[(name, n)]):.3g} s per call; every response "
                                 f"{size.new_tokens} tokens: {full}",
                            point={"regime": "long", "engine": name, "n": n}))
            rows.append(row(GROUP, f"long rollout {name} N={n} (P={P}) tokens", tps[(name, n)], "tokens/s"))
        for peer in ("hf", "vllm"):
            if peer in names:
                rows.append(row(GROUP, f"long rollout torch/{peer} N={n}", ratio(sps[("torch", n)], sps[(peer, n)]),
                                "x", target=TARGETS[f"torch/{peer}"] if n == hi and not smoke else None,
                                fairness=fair))
    for name in names:
        rows.append(row(GROUP, f"long rollout {name} samples/s N={hi} / N={lo}",
                        ratio(sps[(name, hi)], sps[(name, lo)]), "x", note=BRORL_GPU_SCALING))
    if "vllm" in start_s:
        rows.append(row(GROUP, "long vllm engine start (once, excluded above)", start_s["vllm"], "s",
                        note="eager (smoke: no compile)" if smoke else "incl. compile/warm-up"))

    # ---- decode MFU and its profile ---------------------------------------------------------------------------
    decode_s = median(seconds[("torch", hi)])
    hw_fair = (f"peak and copy bandwidth: the best of {size.repeats + 3} rounds of 3 calls (fp32 matmuls "
               f"n={size.matmul_n}; {size.stream_mib} MiB copies), round-robin with the rollouts and after them, and of "
               f"the decode-attention bench's copy rounds; "
               f"{threads} torch threads; body params {counts[0]:,}, LM head {counts[1]:,}; attention FLOPs not counted")
    rows.append(row(GROUP, f"long fp32 matmul peak (n={size.matmul_n}, best)", peak / 1e9, "GFLOP/s", fairness=hw_fair))
    total_prof = sum(prof_shares.values())
    bound = max(prof_shares, key=prof_shares.get)
    decode_mfu = 100 * ratio(decode_flops(big_batch, counts) / decode_s, peak)
    rows.append(row(GROUP, f"long decode (torch engine rollout) N={hi} MFU", decode_mfu, "% peak", fairness=hw_fair,
                    note=f"bounded by {bound} ({100 * prof_shares[bound] / total_prof:.0f}% of the profiled call)"))
    for tag, shares, wall in (("", prof_shares, prof_wall), (" compile_decode", fused_shares, fused_wall)):
        total = sum(shares.values())
        for name, sec in sorted(shares.items(), key=lambda kv: -kv[1]):
            rows.append(row(GROUP, f"long decode{tag} profile N={hi}: {name}", 100 * sec / total, "% time",
                            note=f"torch.profiler self CPU time, one call of {size.profile_tokens} tokens, "
                                 f"{wall:.3g} s wall"))

    # ---- the roofline: the least time this machine allows, and the ratios it caps ---------------------------------
    roof = decode_roofline(big_batch, cfg, counts, peak, bandwidth)
    hf_s = median(seconds[("hf", hi)]) if "hf" in names else None
    rows.append(row(GROUP, f"long memory bandwidth (copy {size.stream_mib} MiB, best)", bandwidth / 1e9, "GB/s",
                    fairness=hw_fair))
    rows.append(row(GROUP, f"long decode roofline N={hi}", roof["seconds"], "s",
                    note=f"{roof['flop_seconds']:.3g} s of model FLOPs at the matmul peak + {roof['kv_gb']:.3g} GB "
                         f"of KV-cache reads at the copy bandwidth; the torch engine took {decode_s:.3g} s"))
    roof_shares = {e: [100 * decode_roofline(p["batch"], cfg, counts, p["peak"], p["bandwidth"])["seconds"] / p["seconds"]
                       for p in pairs[e]] for e in pairs}
    pair_fair = (f"{size.pairs} calls per engine, each after a matmul round (n={size.matmul_n}) and between two "
                 f"{size.stream_mib} MiB copy rounds; each call against the peak and the mean of the two copy "
                 f"bandwidths beside it")

    def spread(e: str) -> str:
        bw = [p["bandwidth"] / 1e9 for p in pairs[e]]
        return (f"median of {len(roof_shares[e])} calls, range {min(roof_shares[e]):.1f} to {max(roof_shares[e]):.1f}%; "
                f"copy "
                f"bandwidth beside them {min(bw):.1f} to {max(bw):.1f} GB/s")

    eager_s, fused_s = (median([p["seconds"] for p in pairs[e]]) for e in ("torch", "torch-fused"))
    rows.append(row(GROUP, f"long decode torch engine speed / roofline N={hi}", median(roof_shares["torch"]),
                    "% roofline", target=None if smoke else TARGETS["decode roofline"], fairness=pair_fair,
                    note=f"{spread('torch')}; against the run's best bandwidth and peak "
                         f"{100 * roof['seconds'] / eager_s:.1f}%"))
    rows.append(row(GROUP, f"long decode torch engine compile_decode speed / roofline N={hi}",
                    median(roof_shares["torch-fused"]), "% roofline", target=None if smoke else TARGETS["decode roofline"],
                    fairness=pair_fair,
                    note=f"the decode step through torch.compile (compiled in the warm-up): {fused_s:.3g} s per call, "
                         f"{fused_s / eager_s:.3g}x the eager engine's {eager_s:.3g} s; {spread('torch-fused')}"))
    if hf_s:
        rows.append(row(GROUP, f"long rollout torch/hf N={hi} at the roofline", hf_s / roof["seconds"], "x",
                        note=f"hf's {hf_s:.3g} s over the roofline: the largest torch/hf any engine could reach here"))

    # ---- decode attention alone against its memory roofline: in the profiled call, and as a kernel ------------------
    Tp = size.profile_tokens
    prompt_tokens = sum(len(x) for x in big_batch.prompt_ids)  # the profiled call's prompts are big_batch's
    prof_kv = kv_bytes_per_token(cfg) * (hi * Tp * (Tp - 1) / 2 + (Tp - 1) * prompt_tokens)  # as decode_roofline
    attn_s = prof_shares.get("attention over the KV cache", 0.0)
    rows.append(row(GROUP, f"long decode attention over the KV cache (profiled call) / its roofline N={hi}",
                    100 * ratio(prof_kv / bandwidth, attn_s), "% roofline", fairness=hw_fair,
                    note=f"{prof_kv / 1e9:.3g} GB of KV at the copy bandwidth over the profile's attention time "
                         f"({attn_s:.3g} s; profiler overhead included)"))
    rows += bench_decode_attention.rows_of(attn, attn_size, threads, group=GROUP, prefix="long ")

    # ---- one update at P=1 x N=lo and x N=hi: peak RSS and update MFU -----------------------------------------
    mem = {}
    with tempfile.TemporaryDirectory(prefix="brorl_bench_long_") as tmp:
        from brorl_lab.rollout.engines import make_engine

        engine = make_engine("torch", path, device="cpu", dtype="float32")
        try:
            small = engine.generate(pool[:1], lo, sampling())
        finally:
            engine.close()
        gen = torch.Generator().manual_seed(0)
        for n, batch in ((lo, small), (hi, big_batch)):
            batch.rewards = torch.randint(0, 2, (batch.size,), generator=gen).float()  # random 0/1: a real loss
            batch.correct = batch.rewards > 0
            batch.meta["temperature"] = 1.0
            f = Path(tmp) / f"batch_{n}.pt"
            torch.save(batch, f)
            mem[n] = run_child(bench_memory.MODULE, {"model": path, "batch": str(f), "max_new_tokens":
                                                     size.new_tokens, "micro_batch_tokens": size.micro_batch_tokens},
                               threads=threads)
    mem_fair = (f"{shape}; P=1 prompt, micro-batch {size.micro_batch_tokens} tokens, kl_beta=1e-3 (reference "
                f"loaded), fp32, {threads} threads; one subprocess per N, peak = VmHWM of the child")
    for n in (lo, hi):
        r = mem[n]
        rows.append(row(GROUP, f"long update peak RSS N={n} (P=1)", r["peak_rss_mib"], "MiB", fairness=mem_fair,
                        note=f"{r['peak_rss_mib'] - r['rss_before_mib']:.0f} MiB above the pre-update RSS; "
                             f"{r['micro_batches']} micro-batches per pass"))
    rows.append(row(GROUP, f"long update peak RSS N={hi} / N={lo}", ratio(mem[hi]["peak_rss_mib"],
                                                                          mem[lo]["peak_rss_mib"]), "x",
                    target=None if smoke else TARGETS["rss"], fairness=mem_fair))
    r = mem[hi]
    rows.append(row(GROUP, f"long update (ref fwd + policy fwd/bwd + AdamW) N={hi} MFU",
                    100 * ratio(r["update_flops"] / r["update_seconds"], peak), "% peak", fairness=hw_fair,
                    note=f"{r['update_seconds']:.3g} s, {r['layout']} layout feeds "
                         f"{r['tokens_fed'] / r['samples']:.1f} tokens/row"))

    # ---- one full RL step vs TRL at N=hi --------------------------------------------------------------------------
    step_size = bench_step_trl.Size(total=size.total, ns=(hi,), max_new_tokens=size.new_tokens,
                                    micro_batch=size.step_micro_batch, warmup=0, timed=1)
    step_rows = bench_step_trl.run(smoke, threads, path=path, size=step_size, sides=("brorl", "fused", "trl"),
                                   fixed_length=True, group=GROUP, prefix="long ",
                                   target=None if smoke else TARGETS["step"])
    rows += step_rows
    trl_figure = f"long step {bench_step_trl.LABEL['trl']} N={hi} P={size.total // hi}"
    trl_s = next((r["value"] for r in step_rows if r["figure"] == trl_figure), None)
    if trl_s:
        floor = roof["seconds"] + update_floor_seconds(big_batch, counts, peak)
        rows.append(row(GROUP, f"long step time brorl_lab/TRL N={hi} at the roofline", floor / trl_s, "x",
                        note=f"rollout roofline + update FLOPs (reference fwd, policy fwd and bwd) at the matmul "
                             f"peak = {floor:.3g} s, over TRL's {trl_s:.3g} s: the smallest ratio any trainer with "
                             f"these FLOPs could reach here"))
    return rows
