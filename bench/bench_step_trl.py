"""Figure 3, one full RL step: brorl_lab's Trainer.step against TRL's GRPOTrainer (with transformers generation,
as on a CPU), on the same model, task prompts, N, prompts per step, max tokens, KL beta and micro-batch.

    .venv/bin/python -m bench.run_all --only step [--smoke]

A step is rollout -> score -> (logprobs) -> reference logprobs -> loss -> backward -> one AdamW step, on P*N samples.
Each side runs in its own subprocess (so its peak RSS, VmHWM, is its own); the processes run in lockstep
(``common.Lockstep``): step k of every side in turn, in a rotating order, only one side computing at a time, so
outside load hits all sides alike. ``warmup`` untimed steps, then the medians of ``timed`` steps are compared.
``proposed`` is brorl_lab with :func:`shared_prefix_token_logprobs` swapped in: a change recommended for
brorl_lab/logprobs.py, measured here so its effect is a number, not a guess (it has no target).

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
    the same padded token capacity (it packs rows by real tokens, so its micro-batches may hold more rows).
  * what differs: TRL skips the old-logprob forward when ``num_iterations=1`` (it uses the detached current
    logprobs); brorl_lab's Trainer always recomputes them (one extra no-grad forward, counted against brorl_lab).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass

from .common import (BENCH_FAMILIES, Lockstep, child_main, format_prompts, median, model_path, ratio, rss_mib,
                     row, set_threads)

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
    from brorl_lab.steps import sample_prompts
    from brorl_lab.trainer import derive_seed

    return [sample_prompts(BENCH_FAMILIES, P, seed=derive_seed(seed, "prompts", s, 0)) for s in range(1, steps + 1)]


def prompt_hash(prompts) -> str:
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:12]


# ---- the proposed change, measured as its own side -----------------------------------------------------------------
def shared_prefix_token_logprobs(model, batch, rows, *, temperature: float, with_entropy: bool = False):
    """PROPOSED for brorl_lab/logprobs.py (not used by brorl_lab itself): ``token_logprobs`` with each prompt's
    forward computed once per micro-batch instead of once per row.

        prefix  = model(prompts of the rows' groups, use_cache=True, logits_to_keep=1)    # [p, S]: KV + first logits
        KV     -> index_select to the rows (autograd carries every row's gradient back into the one prefix pass)
        suffix  = model(response[:, :W-1], past_key_values=KV, attention_mask=[prompt mask, response mask])
        logits  = [prefix logits, suffix logits]                                           # [b, W, V]

    Same values as the packed forward (max |diff| ~3e-6 in fp32, gradients to ~2e-5 relative, checked on the
    default model at N=512 and N=16); at N=512 with ~31 prompt and ~3 response tokens a row, about 10x fewer tokens
    go through the model. Rows must be prompt-major (they are: micro-batches are consecutive rows).
    """
    import torch
    from transformers import DynamicCache

    from brorl_lab.engines.common import left_pad

    rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    prompts, local = torch.unique_consecutive(rows // batch.n, return_inverse=True)  # [p], [b] row -> prompt slot
    ids, mask = left_pad([batch.prompt_ids[i] for i in prompts.tolist()], batch.pad_id)  # [p, S]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    first = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                  past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [p, V]
    lengths = batch.lengths[rows]
    W = max(int(lengths.max()), 1)
    resp = batch.response_ids[rows, :W].to(device)  # [b, W]
    valid = (torch.arange(W)[None] < lengths[:, None]).to(device)  # [b, W]
    z = first[local.to(device)][:, None]  # [b, 1, V]
    if W > 1:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[local.to(device)], layer.values[local.to(device)]
        full_mask = torch.cat([mask.to(device)[local], valid[:, : W - 1].long()], dim=1)  # [b, S + W - 1]
        suffix_pos = pos.to(device)[local, -1:] + 1 + torch.arange(W - 1, device=device)[None]
        z = torch.cat([z, model(input_ids=resp[:, : W - 1], attention_mask=full_mask, position_ids=suffix_pos,
                                past_key_values=cache, use_cache=True).logits], dim=1)  # [b, W, V]
    z = z.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    T = batch.response_ids.shape[1]
    logp = torch.nn.functional.pad((z.gather(-1, resp[..., None])[..., 0] - lse).masked_fill(~valid, 0.0),
                                   (0, T - W))
    entropy = None
    if with_entropy:
        ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        entropy = torch.nn.functional.pad(ent.masked_fill(~valid, 0.0), (0, T - W))
    return logp, entropy


def use_shared_prefix_logprobs() -> None:
    """Swap the proposal in where brorl_lab looks ``token_logprobs`` up (compute_logprobs and steps.update)."""
    from brorl_lab import logprobs, steps

    logprobs.token_logprobs = steps.token_logprobs = shared_prefix_token_logprobs


# ---- the two children ---------------------------------------------------------------------------------------------
def brorl_child(p: dict, link) -> dict:
    from brorl_lab.config import Config
    from brorl_lab.trainer import Trainer

    if p.get("variant") == "shared_prefix":
        use_shared_prefix_logprobs()

    cfg = Config(model=p["model"], engine="torch", tasks=list(BENCH_FAMILIES), template="plain",
                 rollouts_per_prompt=p["n"], prompts_per_step=p["P"], max_new_tokens=p["max_new_tokens"],
                 temperature=1.0, top_p=1.0, kl_beta=p["beta"], kl_estimator="k3", eps_low=0.2, eps_high=0.28,
                 loss_agg="token_mean", advantage="grpo", adv_std_norm=True, lr=p["lr"], lr_scaling="none",
                 adam_betas=[0.9, 0.999], weight_decay=0.0, grad_clip=1.0, optimizer_steps_per_step=1,
                 train_micro_batch_tokens=p["micro_batch_tokens"], dynamic_sampling=False, eval_every=0,
                 checkpoint_every=0, steps=p["steps"], run_dir=p["tmp"], run_name="brorl", seed=p["seed"],
                 torch_threads=p["threads"])
    trainer = Trainer(cfg, progress=False)
    hashes = []
    generate = trainer.engine.generate

    def recording_generate(prompts, n, sampling):
        hashes.append(prompt_hash(prompts))
        return generate(prompts, n, sampling)

    trainer.engine.generate = recording_generate
    link.ready(rss_before_mib=rss_mib())
    for _ in range(p["steps"]):
        link.wait_step()
        t0 = time.perf_counter()
        r = trainer.step()
        link.done(time.perf_counter() - t0, stages={k: r[k] for k in r if k.startswith("time/")})
    return {"prompt_hashes": hashes, "samples": r["samples"], "tokens": r["tokens"]}


def trl_child(p: dict, link) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from brorl_lab.models import load_tokenizer
    from brorl_lab.rewards import score_response
    from brorl_lab.tasks import TaskItem

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
        log_completions=False)
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
    from brorl_lab.models import load_tokenizer

    tok = load_tokenizer(path)
    prompts = [pr for items in step_items(P, steps, SEED) for pr in format_prompts(items, tok)]
    return max(len(x) for x in tok(prompts)["input_ids"])


LABEL = {"brorl": "brorl_lab", "trl": "TRL GRPOTrainer", "proposed": "brorl_lab+SP (proposed)"}  # SP: shared prefix


def run(smoke: bool = False, threads=None) -> list[dict]:
    size = SMOKE if smoke else FULL
    threads = set_threads(threads)
    path = model_path()
    sides = ("brorl", "trl", "proposed") if trl_available() else ("brorl", "proposed")
    steps = size.warmup + size.timed
    rows = []
    for n in size.ns:
        P = size.total // n
        mb_tokens = size.micro_batch * (longest_prompt_tokens(path, P, steps) + size.max_new_tokens)
        payload = {"model": path, "n": n, "P": P, "max_new_tokens": size.max_new_tokens, "steps": steps,
                   "micro_batch": size.micro_batch, "micro_batch_tokens": mb_tokens, "beta": BETA, "lr": LR,
                   "seed": SEED}
        payloads = {side: {**payload, "side": side, **({"variant": "shared_prefix"} if side == "proposed" else {})}
                    for side in sides}
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
        fair = (f"same model/prompts/N/max_new_tokens={size.max_new_tokens}/beta={BETA}/lr={LR}, {threads} "
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
            rows.append(row(GROUP, f"step {LABEL[side]} {where}", step_s[side], "s/step", note=note))
            rows.append(row(GROUP, f"step {LABEL[side]} {where} peak RSS", peak[side], "MiB",
                            note=f"{base[side]:.0f} MiB before the first step"))
        for side in ("brorl", "proposed") if trl else ():
            tag = LABEL[side].split()[0]
            note = "" if side == "brorl" else "SP: shared_prefix_token_logprobs swapped in (a proposal, no target)"
            rows.append(row(GROUP, f"step time {tag}/TRL {where}", ratio(step_s[side], step_s["trl"]),
                            "x", target="<= 0.5" if n == 512 and side == "brorl" else None, fairness=fair,
                            note=note if same_prompts else "PROMPTS DIFFERED"))
            grow = ratio(peak[side] - base[side], peak["trl"] - base["trl"])
            rows.append(row(GROUP, f"step peak RSS {tag}/TRL {where}", ratio(peak[side], peak["trl"]), "x",
                            note=f"above the pre-step RSS: {grow:.2f}x", fairness=fair))
    return rows


if __name__ == "__main__":
    child_main(child)
