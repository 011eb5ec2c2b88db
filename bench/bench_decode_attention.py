"""Decode attention alone: how fast the torch engine's decode step reads the generated KV cache, against this
machine's copy bandwidth measured in the same process, interleaved with it, and candidate kernels beside it.

    .venv/bin/python -m bench.bench_decode_attention [--smoke] [--threads 1] [--repeats 9]

At long responses a decode step is bounded by reading every row's keys and values so far: at generated column t
each of R rows reads ``2 * H_kv * (t+1) * d * 4`` bytes per layer (fp32); the prompt's prefix is read once per
prompt by one matmul (:mod:`brorl_lab.core.prefix_attention`). Each case below decodes the columns in ``lengths``
(spread over the response, so short and long caches weigh as in a whole call) for one layer, writing column t of
the buffers and then attending over columns 0..t:

    engine       what the engine runs: keys [R, H_kv, T, d], ``shared_prefix_attention`` (bmm, joint softmax)
    transposed   the same with keys stored [R, H_kv, d, T]: the score matmul reads d rows of t columns (long
                 vector loads) instead of t dot products of length d; the column write becomes scattered
    sdpa         the rows' own keys through ``aten._scaled_dot_product_flash_attention_for_cpu`` (blocked, returns
                 the log-sum-exp), the prefix by one matmul per prompt, the two joined by their log-sum-exps
    read         only reads the same KV (a sum over it): no kernel that reads it can take less time

Cases run round-robin with copy rounds (``bench_hw.stream_round``: bytes read + written per second, best call of
each round); each reports its median. Ratios (engine / candidate) are what a loaded machine bends least; the GB/s
and the share of the copy bandwidth are absolute and want a quiet machine. CPU time (``time.process_time``) is
reported beside wall time: with one thread it does not count time the process waited for a core.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .bench_hw import stream_round
from .common import format_table, median, ratio, row, set_threads

GROUP = "decode_attention"
CASES = ("engine", "transposed", "sdpa", "read")


@dataclass(frozen=True)
class Size:
    rows: int  # R: sampled sequences decoded together (P prompts x N)
    prompts: int  # P
    kv_heads: int  # H_kv (query heads = kv_heads * group)
    group: int  # g: query heads per KV head
    head_dim: int  # d
    prefix: int  # L: prompt tokens (the shared prefix)
    T: int  # buffer columns (max_new_tokens)
    lengths: tuple  # generated columns t decoded in one timed case
    repeats: int
    stream_mib: int


# The long bench's shape (bench/long_model.py: 4 heads of 64, no GQA; N=512, P=1, 256 new tokens, ~24-token prompts)
FULL = Size(rows=512, prompts=1, kv_heads=4, group=1, head_dim=64, prefix=24, T=256, lengths=(32, 96, 160, 224),
            repeats=9, stream_mib=256)
SMOKE = Size(rows=16, prompts=2, kv_heads=2, group=2, head_dim=16, prefix=5, T=8, lengths=(2, 6), repeats=1,
             stream_mib=4)


def attention_bytes(size: Size) -> int:
    """KV bytes one timed case reads: per column t, every row's own keys and values 0..t plus each prompt's
    prefix, fp32."""
    per_col = 2 * size.kv_heads * size.head_dim * 4
    return sum(per_col * (size.rows * (t + 1) + size.prompts * size.prefix) for t in size.lengths)


def decode_case(size: Size, kind: str, seed: int = 0):
    """A callable decoding ``size.lengths`` columns of one layer the way ``kind`` (one of :data:`CASES`) does; it
    returns the last attention output [R, 1, H*d] (so the candidates can be checked against the engine's)."""
    import torch

    from brorl_lab.core.prefix_attention import PrefixGrid, padding_bias, shared_prefix_attention

    gen = torch.Generator().manual_seed(seed)
    R, P, Hkv, g, d, L, T = (size.rows, size.prompts, size.kv_heads, size.group, size.head_dim, size.prefix,
                             size.T)
    mask = torch.ones(P, L, dtype=torch.long)
    mask[0, : L // 4] = 0  # one left-padded prompt
    bias = padding_bias(mask)  # [P, L]
    pk, pv = torch.randn(P, Hkv, L, d, generator=gen), torch.randn(P, Hkv, L, d, generator=gen)
    gk = torch.randn(R, Hkv, T, d, generator=gen)  # [R, H_kv, T, d]
    gk = gk.transpose(-1, -2).contiguous() if kind == "transposed" else gk  # the same keys, stored [R, H_kv, d, T]
    gv = torch.randn(R, Hkv, T, d, generator=gen)
    q = torch.randn(len(size.lengths), R, Hkv * g, 1, d, generator=gen)  # [steps, R, H, 1, d]
    k_new = torch.randn(len(size.lengths), R, Hkv, 1, d, generator=gen)
    v_new = torch.randn(len(size.lengths), R, Hkv, 1, d, generator=gen)
    grid, scale = PrefixGrid(P, R // P), d ** -0.5
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def sdpa(qi, own_k, own_v):  # [R, H, 1, d] -> [R, 1, H*d]
        qg = qi.reshape(R, Hkv, g, d)  # [R, H_kv, g, d]
        o_own, lse_own = flash(qg, own_k, own_v, scale=scale)  # [R, H_kv, g, d], [R, H_kv, g]
        s = grid.from_grid(grid.to_grid(qg) @ pk.transpose(-1, -2) * scale + bias[:, None, None, :])  # [R,H_kv,g,L]
        lse_pre = s.logsumexp(-1)  # [R, H_kv, g]
        o_pre = grid.from_grid(grid.to_grid((s - lse_pre[..., None]).exp()) @ pv)
        o = torch.lerp(o_own, o_pre, torch.sigmoid(lse_pre - lse_own)[..., None])  # weights e^lse_pre : e^lse_own
        return o.reshape(R, Hkv * g, 1, d).transpose(1, 2).reshape(R, 1, -1)

    def run():
        out = None
        for i, t in enumerate(size.lengths):  # the engine's append, then attention over columns 0..t
            gv[:, :, t] = v_new[i, :, :, 0]
            if kind == "transposed":
                gk[..., t] = k_new[i, :, :, 0]
                own_k = gk[..., : t + 1].transpose(-1, -2)  # a view [R, H_kv, t+1, d]
            else:
                gk[:, :, t] = k_new[i, :, :, 0]
                own_k = gk[:, :, : t + 1]
            if kind == "read":
                out = own_k.sum() + gv[:, :, : t + 1].sum()
            elif kind == "sdpa":
                out = sdpa(q[i], own_k, gv[:, :, : t + 1])
            else:
                out = shared_prefix_attention(q[i], pk, pv, bias, own_k, gv[:, :, : t + 1], scale, grid)
        return out

    return run


def measure(size: Size) -> dict:
    """Interleaved timing of :data:`CASES` and the copy bandwidth. Returns ``{"wall": {case: median s}, "cpu":
    {case: median CPU s}, "gbps": {case: attention GB/s by wall time}, "copy_gbps": best copy GB/s, "bytes": KV
    bytes per case, "max_diff": {case: largest |difference| from the engine's output}}``."""
    import time

    cases = {kind: decode_case(size, kind) for kind in CASES}
    ref = cases["engine"]()
    max_diff = {k: float((fn() - ref).abs().max()) for k, fn in cases.items() if k not in ("engine", "read")}
    cases["read"]()  # every case has now run once, untimed
    copy = stream_round(size.stream_mib, 3)
    wall, cpu = {k: [] for k in cases}, {k: [] for k in cases}
    copies = []
    for _ in range(size.repeats):  # round-robin: each case, then a copy round
        for kind, fn in cases.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[kind].append(time.perf_counter() - t0)
            cpu[kind].append(time.process_time() - c0)
        copies.append(copy())
    nbytes = attention_bytes(size)
    wall_s = {k: median(v) for k, v in wall.items()}
    return {"wall": wall_s, "cpu": {k: median(v) for k, v in cpu.items()},
            "gbps": {k: nbytes / s / 1e9 for k, s in wall_s.items()}, "copy_gbps": max(copies) / 1e9,
            "bytes": nbytes, "max_diff": max_diff}


def rows_of(m: dict, size: Size, threads: int, group: str = GROUP, prefix: str = "") -> list[dict]:
    """Result rows of :func:`measure`: each case's GB/s and share of the copy bandwidth, and engine / candidate."""
    fair = (f"R={size.rows} rows (P={size.prompts}), H_kv={size.kv_heads} x g={size.group} heads of "
            f"d={size.head_dim}, prefix {size.prefix}, columns t in {list(size.lengths)} of T={size.T}, one layer, "
            f"fp32; median of {size.repeats} round-robin with copy rounds ({size.stream_mib} MiB, best of 3); "
            f"{threads} torch threads; one process")
    out = []
    for kind in CASES:
        what = "the engine's" if kind == "engine" else f"candidate {kind}"
        out.append(row(group, f"{prefix}decode attention alone, {what}: KV read rate", m["gbps"][kind], "GB/s",
                       fairness=fair, note=f"{1e3 * m['wall'][kind]:.3g} ms wall, {1e3 * m['cpu'][kind]:.3g} ms "
                                           f"CPU for {m['bytes'] / 1e6:.3g} MB of KV"))
        out.append(row(group, f"{prefix}decode attention alone, {what} / copy bandwidth",
                       100 * ratio(m["gbps"][kind], m["copy_gbps"]), "% copy bw", fairness=fair,
                       note=f"copy {m['copy_gbps']:.3g} GB/s (read + write), same process, interleaved"))
        if kind != "engine":
            diff = f"; output differs from the engine's by {m['max_diff'][kind]:.2g}" if kind in m["max_diff"] else ""
            out.append(row(group, f"{prefix}decode attention alone, engine / {kind} time", ratio(
                m["wall"]["engine"], m["wall"][kind]), "x", fairness=fair,
                note=f"CPU time: {ratio(m['cpu']['engine'], m['cpu'][kind]):.3g}x; > 1: {kind} is faster{diff}"))
    return out


def run(smoke: bool = False, threads=None) -> list[dict]:
    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    return rows_of(measure(size), size, threads)


def main(argv=None) -> None:
    from dataclasses import replace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    ap.add_argument("--repeats", type=int, default=None, help="round-robin repetitions (default: the size's)")
    args = ap.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    if args.repeats:
        size = replace(size, repeats=args.repeats)
    threads = set_threads(args.threads)
    print(format_table(rows_of(measure(size), size, threads)))


if __name__ == "__main__":
    main()
