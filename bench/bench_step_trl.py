"""Figure 3, one full RL step: brorl_lab's Trainer.step against TRL's GRPOTrainer (with transformers generation,
as on a CPU), on the same model, task prompts, N, prompts per step, max tokens, KL beta and micro-batch.

    .venv/bin/python -m bench.run_all --only step [--smoke]

A step is rollout -> score -> (logprobs) -> reference logprobs -> loss -> backward -> one AdamW step, on P*N samples.
Each side runs in its own subprocess (so its peak RSS, VmHWM, is its own); the processes run in lockstep
(``common.Lockstep``): step k of every side in turn, in a rotating order, only one side computing at a time, so
outside load hits all sides alike. ``warmup`` untimed steps, then the medians of ``timed`` steps are compared.
A third side, ``packed``, is brorl_lab with ``logprob_layout="packed"`` (one forward per row over prompt +
response, micro-batches counted per row: the layout before issue 7's fix), so the shared-prefix layout's effect
is measured, not asserted.

How the two are made to do the same work:
  * model: the same local HF directory, fp32 on CPU (TRL: ``use_cpu=True, bf16=False``), the same torch threads;
    TRL's default gradient checkpointing is turned off (brorl_lab does not checkpoint; it would add a forward).
  * prompts: step s uses the same P task items on both sides (``sample_prompts(families, P,
    seed=derive_seed(seed, "prompts", s, 0))``, which is what Trainer draws), formatted with the plain template;
    TRL reads them in order (``shuffle_dataset=False``). Both sides record a hash of the prompts of each step.
  * sampling: N = ``num_generations``, temperature 1, top_p 1, no top-k, ``max_completion_length`` =
    ``max_new_tokens``, EOS stop.
  * reward: brorl_lab's verifier, wrapped as TRL's ``reward_funcs`` (``score_response(completion, item)``).
  * loss: GRPO advantages (group mean/std; TRL ``scale_rewards="group"``), PPO clip 0.2 / 0.28 (TRL ``epsilon``,
    ``epsilon_high``), token-mean over the step's tokens (TRL ``loss_type="dapo"``), k3 KL with the same beta, one
    optimizer step per step (TRL ``gradient_accumulation_steps = P*N / micro_batch``, ``num_iterations=1``), same
    lr (constant), AdamW betas, no weight decay, grad clip 1.0. No dynamic sampling (TRL has none).
  * micro-batch: TRL's ``per_device_train_batch_size`` = ``micro_batch`` samples, padded to the longest prompt and
    completion; brorl_lab's ``train_micro_batch_tokens`` = ``micro_batch * (longest prompt + max_new_tokens)``,
    the same token capacity. brorl_lab counts tokens as its layout holds them (``logprobs.plan_micro_batches``:
    each prompt once per micro-batch, each response token with its attention scores), so its micro-batches hold
    more rows; the peak-RSS rows show what that costs in memory.
  * old log-probs: both sides are on-policy (one optimizer step, no importance correction), so both skip the
    old-logprob forward and use the detached current log-probs (TRL with ``num_iterations=1``; brorl_lab's
    ``steps.is_on_policy``).
  * what differs: the forward layout. TRL runs prompt + completion per sample; brorl_lab (``logprob_layout``
    "auto") runs each prompt once per micro-batch and the completions against its cached KV, read once per prompt
    by ``brorl_lab.core.prefix_attention`` (same numbers).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace

from .common import BENCH_FAMILIES, Lockstep, child_main, format_prompts, median, model_path, ratio, row, rss_mib, set_threads

GROUP = "step"
MODULE = "bench.bench_step_trl"


@dataclass(frozen=True)
class Size:
    total: int  # samples per step (P = total / N)
    ns: tuple
    max_new_tokens: int
    micro_batch: int  # samples per forward/backward (TRL per_device_train_batch_size)
    warmup: int
    timed: int


FULL = Size(total=512, ns=(16, 64, 512), max_new_tokens=16, micro_batch=64, warmup=1, timed=4)
SMOKE = Size(total=16, ns=(8,), max_new_tokens=4, micro_batch=8, warmup=1, timed=1)
BETA, LR, SEED = 1e-3, 1e-5, 0


def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def step_items(P: int, steps: int, seed: int):
    """The P items of steps 1..steps, exactly as brorl_lab's Trainer draws them (no dynamic sampling: round 0)."""
    from brorl_lab.rl.steps import sample_prompts
    from brorl_lab.rl.trainer import derive_seed

    return [sample_prompts(BENCH_FAMILIES, P, seed=derive_seed(seed, "prompts", s, 0)) for s in range(1, steps + 1)]


def prompt_hash(prompts) -> str:
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:12]


# ---- the children (one per side) ---------------------------------------------------------------------------------
def brorl_child(p: dict, link) -> dict:
    from brorl_lab.core.config import Config
    from brorl_lab.rl.trainer import Trainer

    cfg = Config(model=p["model"], engine="torch", tasks=list(BENCH_FAMILIES), template="plain",
                 rollouts_per_prompt=p["n"], prompts_per_step=p["P"], max_new_tokens=p["max_new_tokens"],
                 temperature=1.0, top_p=1.0, kl_beta=p["beta"], kl_estimator="k3", eps_low=0.2, eps_high=0.28,
                 loss_agg="token_mean", advantage="grpo", adv_std_norm=True, lr=p["lr"], lr_scaling="none",
                 adam_betas=[0.9, 0.999], weight_decay=0.0, grad_clip=1.0, optimizer_steps_per_step=1,
                 train_micro_batch_tokens=p["micro_batch_tokens"], dynamic_sampling=False, eval_every=0,
                 checkpoint_every=0, steps=p["steps"], run_dir=p["tmp"], run_name=f"brorl-{p['side']}", seed=p["seed"],
                 torch_threads=p["threads"], logprob_layout=p["layout"], compile_step=p["side"] == "fused")
    trainer = Trainer(cfg, progress=False)
    if cfg.compile_step:
        compile_warmup(trainer)
    hashes = []
    generate = trainer.engine.generate

    def recording_generate(prompts, n, sampling):
        hashes.append(prompt_hash(prompts))
        if p.get("fixed_length"):  # the long-response regime: every response runs to max_new_tokens
            sampling = replace(sampling, ignore_eos=True)
        return generate(prompts, n, sampling)

    trainer.engine.generate = recording_generate
    link.ready(rss_before_mib=rss_mib())
    for _ in range(p["steps"]):
        link.wait_step()
        t0 = time.perf_counter()
        r = trainer.step()
        link.done(time.perf_counter() - t0, stages={k: r[k] for k in r if k.startswith("time/")})
    return {"prompt_hashes": hashes, "samples": r["samples"], "tokens": r["tokens"]}


def compile_warmup(trainer) -> None:
    """Compile ``Config.compile_step``'s graphs before the timed steps, without taking a step (the prompts, seeds
    and weights of the steps are untouched): decode at one and at two prompts (torch.compile specialises a size of
    1), and the trainer's log-probs without and with a backward, on a small batch."""
    from brorl_lab.rl.logprobs import compute_logprobs, token_logprobs
    from brorl_lab.rollout.engines import RolloutSampling

    prompts = ["What is 12+7?", "Add 3 and 4:"]
    sampling = RolloutSampling(temperature=1.0, max_new_tokens=8, seed=0, ignore_eos=True)
    trainer.engine.generate(prompts[:1], 2, sampling)
    batch = trainer.engine.generate(prompts, 2, sampling)
    compute_logprobs(trainer.policy, batch, temperature=1.0, micro_batch_tokens=10**6, fused=True)
    logp, _ = token_logprobs(trainer.policy, batch, range(batch.size), temperature=1.0, fused=True)
    logp.sum().backward()
    trainer.policy.zero_grad(set_to_none=True)


def trl_child(p: dict, link) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from brorl_lab.core.models import load_tokenizer
    from brorl_lab.rollout.rewards import score_response
    from brorl_lab.rollout.tasks import TaskItem

    tok = load_tokenizer(p["model"])
    per_step = step_items(p["P"], p["steps"], p["seed"])
    rows = [{"prompt": pr, "item": json.dumps(asdict(it))}
            for items in per_step for it, pr in zip(items, format_prompts(items, tok))]
    hashes = []

    def brorl_verifier(prompts, completions, item, **kwargs):
        hashes.append(prompt_hash(prompts[:: p["n"]]))  # TRL repeats each prompt N times, in order
        return [score_response(c, TaskItem(**json.loads(i)), "plain").reward for c, i in zip(completions, item)]

    class LockstepTimer(TrainerCallback):
        """A TRL step runs between ``on_step_begin`` (generation happens in the first micro-batch after it) and
        ``on_step_end`` (after the optimizer step); the logging after it is not timed (in TRL's favour)."""

        threads: set = set()

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 0:
                link.ready(rss_before_mib=rss_mib())
            link.wait_step()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            link.done(time.perf_counter() - self.t0)
            self.threads.add(torch.get_num_threads())

    samples = p["P"] * p["n"]
    args = GRPOConfig(
        output_dir=f"{p['tmp']}/trl", use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=p["micro_batch"], gradient_accumulation_steps=samples // p["micro_batch"],
        num_generations=p["n"], max_completion_length=p["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0,
        beta=p["beta"], epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1,
        learning_rate=p["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, max_grad_norm=1.0, max_steps=p["steps"], shuffle_dataset=False, seed=p["seed"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False,
        # the long-response regime: EOS suppressed until max_completion_length, every completion at full length
        generation_kwargs={"min_new_tokens": p["max_new_tokens"]} if p.get("fixed_length") else None)
    timer = LockstepTimer()
    trainer = GRPOTrainer(model=p["model"], reward_funcs=brorl_verifier, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[timer])
    dtype = str(next(trainer.model.parameters()).dtype)
    trainer.train()
    return {"prompt_hashes": hashes, "dtype": dtype, "threads_seen": sorted(timer.threads),
            "trl_version": __import__("trl").__version__, "samples": samples}


def child(p: dict, link) -> dict:
    return trl_child(p, link) if p["side"] == "trl" else brorl_child(p, link)


# ---- the figure ---------------------------------------------------------------------------------------------------
def longest_prompt_tokens(path: str, P: int, steps: int) -> int:
    from brorl_lab.core.models import load_tokenizer

    tok = load_tokenizer(path)
    prompts = [pr for items in step_items(P, steps, SEED) for pr in format_prompts(items, tok)]
    return max(len(x) for x in tok(prompts)["input_ids"])


LABEL = {"brorl": "brorl_lab", "trl": "TRL GRPOTrainer", "packed": "brorl_lab-packed",
         "fused": "brorl_lab-compile_step"}
LAYOUT = {"brorl": "auto", "packed": "packed", "fused": "auto"}
NOTES = {"packed": "logprob_layout='packed': the layout before issue 7's fix (no target)",
         "fused": "Config(compile_step=True): decode step and norms/MLPs through torch.compile, compiled before the "
                  "first step (bench_step_trl.compile_warmup)"}


def run(smoke: bool = False, threads=None, *, path=None, size=None, sides=None, fixed_length: bool = False,
        group: str = GROUP, prefix: str = "", target: str = "<= 0.5") -> list[dict]:
    """The figure's rows. The keywords are for ``bench_long``: another model, sizes, sides (default brorl, trl and
    packed), fixed-length responses (``ignore_eos`` / TRL ``min_new_tokens``), row group, figure-name prefix and
    the target of the brorl_lab/TRL time ratio at N=512."""
    size = size or (SMOKE if smoke else FULL)
    threads = set_threads(threads)
    path = path or model_path()
    sides = tuple(s for s in (sides or ("brorl", "trl", "packed")) if s != "trl" or trl_available())
    steps = size.warmup + size.timed
    rows = []
    for n in size.ns:
        P = size.total // n
        mb_tokens = size.micro_batch * (longest_prompt_tokens(path, P, steps) + size.max_new_tokens)
        payload = {"model": path, "n": n, "P": P, "max_new_tokens": size.max_new_tokens, "steps": steps,
                   "micro_batch": size.micro_batch, "micro_batch_tokens": mb_tokens, "beta": BETA, "lr": LR,
                   "seed": SEED, "fixed_length": fixed_length}
        payloads = {side: {**payload, "side": side, "layout": LAYOUT.get(side)} for side in sides}
        seconds, stages = {s: [] for s in sides}, {s: [] for s in sides}
        with Lockstep(MODULE, payloads, threads=threads) as ls:
            ready = ls.ready()
            for k in range(steps):  # step k of every side, in a rotating order, one process computing at a time
                for side in sides[k % len(sides):] + sides[: k % len(sides)]:
                    done = ls.step(side)
                    seconds[side].append(done["seconds"])
                    stages[side].append(done.get("stages"))
            result = ls.finish()
        step_s = {s: median(seconds[s][size.warmup:]) for s in sides}
        peak = {s: result[s]["peak_rss_mib"] for s in sides}
        base = {s: ready[s]["rss_before_mib"] for s in sides}
        same_prompts = all(result[s]["prompt_hashes"][:steps] == result["brorl"]["prompt_hashes"][:steps]
                           for s in sides)
        where = f"N={n} P={P}"
        trl = result.get("trl")
        fair = (("fixed-length responses (brorl_lab ignore_eos, TRL min_new_tokens), " if fixed_length else "") +
                f"same model/prompts/N/max_new_tokens={size.max_new_tokens}/beta={BETA}/lr={LR}, {threads} "
                f"threads, {P * n} samples and 1 optimizer step per step, micro-batch {size.micro_batch} samples (brorl_lab: "
                f"{mb_tokens} tokens)" + (f", TRL {trl['trl_version']} {trl['dtype']} no grad checkpointing"
                                          if trl else "") +
                f"; median of {size.timed} steady-state steps per side after {size.warmup} warm-up, one subprocess "
                f"per side run in lockstep (step k of each side in turn, rotating order); "
                f"prompts identical: {same_prompts}")
        for side in sides:
            if side == "trl":
                note = f"torch threads seen: {trl['threads_seen']}"
            else:
                st = stages[side][size.warmup:]
                note = ", ".join(f"{k[5:]} {median([x[k] for x in st]):.2f}s" for k in st[0] if k != "time/filter")
            rows.append(row(group, f"{prefix}step {LABEL[side]} {where}", step_s[side], "s/step", note=note))
            rows.append(row(group, f"{prefix}step {LABEL[side]} {where} peak RSS", peak[side], "MiB",
                            note=f"{base[side]:.0f} MiB before the first step"))
        for side in tuple(s for s in ("brorl", "fused", "packed") if s in sides) if trl else ():
            tag = LABEL[side]
            note = NOTES.get(side, "")
            rows.append(row(group, f"{prefix}step time {tag}/TRL {where}", ratio(step_s[side], step_s["trl"]),
                            "x", target=target if n == 512 and side in ("brorl", "fused") else None, fairness=fair,
                            note=note if same_prompts else "PROMPTS DIFFERED"))
            grow = ratio(peak[side] - base[side], peak["trl"] - base["trl"])
            rows.append(row(group, f"{prefix}step peak RSS {tag}/TRL {where}", ratio(peak[side], peak["trl"]), "x",
                            note=f"above the pre-step RSS: {grow:.2f}x", fairness=fair))
    return rows


if __name__ == "__main__":
    child_main(child)
