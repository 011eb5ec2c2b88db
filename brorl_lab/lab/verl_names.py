"""verl's names for our knobs: a :class:`Config` as Hydra overrides of verl 0.9.1's PPO trainer (``verl.trainer.main_ppo``).

    overrides, warnings = verl_overrides(cfg, data_dir="${oc.env:BRORL_VERL_DIR}")
    # {"actor_rollout_ref.rollout.n": 16, "data.train_batch_size": 16, "algorithm.adv_estimator": "grpo", ...}

Every Config field is in :data:`VERL_FIELDS` (docs/ECOSYSTEM.md's "verl names" table): mapped to verl keys, folded into
another field (``lr_scaling`` into ``optim.lr``), written into the data files (tasks, template, reward), or marked as
having no verl equivalent. A field of the last kind that changes what is trained (ProRL's reference and optimizer
reset, the resample cap, pass@k with k > 1, ...) and is set away from its neutral value gives one warning line
naming it; ``launch --strict`` makes those lines one error. Nothing is dropped without a line.

Facts are from verl 0.9.1's packaged config (``verl/trainer/config/ppo_trainer.yaml`` and the files it composes) and
source: dynamic sampling is ``algorithm.filter_groups`` in ``main_ppo``'s own config, consumed by the v1 trainer's
replay buffer (``trainer.use_v1=true``, the default; the DAPO recipe is no longer part of the package); it refills
groups until ``train_batch_size`` is met and ignores ``max_num_gen_batches``.
"""

from __future__ import annotations

import math
from typing import Any

from brorl_lab.core.config import Config, ConfigError

#: verl's estimator for each of ours (verl.trainer.ppo.core_algos.AdvantageEstimator). Dr.GRPO is verl's grpo
#: without the std division (norm_adv_by_std_in_grpo=False).
ADVANTAGES = {"grpo": "grpo", "dr_grpo": "grpo", "rloo": "rloo", "reinforce_pp_baseline": "reinforce_plus_plus_baseline"}
#: verl's actor.policy_loss.loss_mode: 'vanilla' is PPO-clip with clip_ratio_low/high; 'gpg' is -A * log pi.
POLICY_LOSSES = {"ppo_clip": "vanilla", "pg": "gpg"}
LOSS_AGGREGATIONS = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
                     "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
#: KL estimators by placement: actor.kl_loss_type (loss) and algorithm.kl_penalty (reward), verl's kl_penalty_forward.
KL_LOSS_TYPES = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}
KL_PENALTIES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
#: Trackers: ours -> verl's Tracking backends; 'file' (jsonl, what import-run reads) and 'console' are always on.
LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb"}

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
OPTIM = f"{ACTOR}.optim"
RC = "algorithm.rollout_correction"

#: Our Config field -> (verl key(s) or how it travels, note). One row per docs/ECOSYSTEM.md table line; a test checks every
#: Config field is here.
VERL_FIELDS: dict[str, tuple[str, str]] = {
    "rollouts_per_prompt": (f"{ROLLOUT}.n", "N"),
    "prompts_per_step": ("data.train_batch_size", "prompts per step (after dynamic sampling in both)"),
    "optimizer_steps_per_step": (f"{ACTOR}.ppo_mini_batch_size", "= prompts_per_step / optimizer_steps_per_step "
                                                                  "(verl counts mini-batches in prompts); ppo_epochs=1"),
    "train_micro_batch_tokens": (f"{ACTOR}.ppo_max_token_len_per_gpu", "with use_dynamic_bsz=true; memory only, at "
                                                                        "least prompt + response length"),
    "lr": (f"{OPTIM}.lr", "after lr_scaling (the effective lr); constant schedule"),
    "lr_scaling": (f"{OPTIM}.lr", "folded into the lr written"),
    "lr_reference_samples": (f"{OPTIM}.lr", "folded into the lr written"),
    "lr_reference_prompts": (f"{OPTIM}.lr", "folded into the lr written"),
    "lr_warmup_steps": (f"{OPTIM}.lr_warmup_steps", "in training steps; verl's warm-up gives step 1 lr 0 (ours lr/K)"),
    "lr_scheduler_type": (f"{OPTIM}.lr_scheduler_type", "constant, cosine; 'linear' (verl's FSDP optimizer has "
                                                       "none): constant and a warning"),
    "adam_betas": (f"{OPTIM}.betas", ""),
    "weight_decay": (f"{OPTIM}.weight_decay", "verl's default is 0.01: always written"),
    "grad_clip": (f"{ACTOR}.grad_clip, {OPTIM}.clip_grad", ""),
    "advantage": ("algorithm.adv_estimator", "grpo, dr_grpo -> grpo (norm_adv_by_std_in_grpo=false), rloo, "
                                             "reinforce_pp_baseline -> reinforce_plus_plus_baseline"),
    "adv_std_norm": ("algorithm.norm_adv_by_std_in_grpo", "grpo only"),
    "policy_loss": (f"{ACTOR}.policy_loss.loss_mode", "ppo_clip -> vanilla, pg -> gpg"),
    "loss_agg": (f"{ACTOR}.loss_agg_mode", "token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"),
    "eps_low": (f"{ACTOR}.clip_ratio_low", "also clip_ratio"),
    "eps_high": (f"{ACTOR}.clip_ratio_high", "clip-higher"),
    "kl_beta": (f"{ACTOR}.kl_loss_coef or algorithm.kl_ctrl.kl_coef", "0: use_kl_loss=false, use_kl_in_reward=false"),
    "kl_placement": (f"{ACTOR}.use_kl_loss / algorithm.use_kl_in_reward", "loss / reward (kl_ctrl.type=fixed)"),
    "kl_estimator": (f"{ACTOR}.kl_loss_type / algorithm.kl_penalty", "k1, k2, k3 -> low_var_kl (loss); kl, mse, "
                                                                     "low_var_kl (reward); verl clamps k3 to [-10, 10]"),
    "is_correction": (f"{RC}.rollout_is", "none -> null; truncate, icepop_mask -> token"),
    "is_cap": (f"{RC}.rollout_is_threshold", "truncate: the upper bound (TIS)"),
    "icepop_low": (f"{RC}.rollout_is_threshold", "icepop_mask: 'low_high' (IcePop)"),
    "icepop_high": (f"{RC}.rollout_is_threshold", "icepop_mask: 'low_high' (IcePop)"),
    "entropy_coef": (f"{ACTOR}.entropy_coeff", ""),
    "reward": ("reward module (extra_info.reward)", "score or correct, per row; acc = correct is always logged"),
    "dynamic_sampling": ("algorithm.filter_groups.enable", "metric=acc (our `correct`), in main_ppo's config (v1 "
                                                          "trainer's replay buffer)"),
    "max_resample_rounds": ("-", "verl refills until train_batch_size is met, with no cap: a warning"),
    "reset_every": ("-", "ProRL's reference reset: verl has none, a warning"),
    "reset_every_samples": ("-", "a warning, as reset_every"),
    "reset_on_kl": ("-", "a warning, as reset_every"),
    "reset_optimizer": ("-", "only with a reset (a warning there)"),
    "temperature": (f"{ROLLOUT}.temperature", ""),
    "top_p": (f"{ROLLOUT}.top_p", ""),
    "max_new_tokens": ("data.max_response_length", "rollout.response_length follows it"),
    "steps": ("trainer.total_training_steps", "total_epochs set so the data never runs out first"),
    "max_samples": ("-", "verl stops on steps only: a budget of generated samples is a warning"),
    "eval_every": ("trainer.test_freq", "val_before_train=true (ours evaluates at step 0 too)"),
    "eval_at_steps": ("trainer.test_freq", "the gcd of eval_every and these steps (a grid holding every one of them); "
                                           "a warning names the extra evaluations that grid adds"),
    "eval_at_samples": ("-", "verl evaluates on steps only (test_freq): a warning"),
    "eval_samples": (f"{ROLLOUT}.val_kwargs.n", "do_sample=true"),
    "eval_temperature": (f"{ROLLOUT}.val_kwargs.temperature", ""),
    "eval_top_p": (f"{ROLLOUT}.val_kwargs.top_p", ""),
    "eval_k": ("-", "verl logs mean@n of acc (= pass@1); k > 1: a warning (its best@k is a bootstrap, not the "
                    "unbiased pass@k)"),
    "eval_prompts": ("data.val_files", "the first eval_prompts items of each family's frozen eval set"),
    "tasks": ("data.train_files", "train-split items, data_source = family"),
    "eval_tasks": ("data.val_files", "frozen eval sets, data_source = family"),
    "task_configs": ("data files (extra_info.task_config)", "the reward module rebuilds user-named tasks with it"),
    "template": ("prompt messages + actor_rollout_ref.model.custom_chat_template", "plain: a pass-through chat "
                                                                                  "template, so the prompt is ours"),
    "model": ("actor_rollout_ref.model.path", "a local directory, resolved; --model-path overrides"),
    "seed": ("data.seed, actor.data_loader_seed, rollout.seed", "and the data files' sampling seed"),
    "dtype": (f"{ROLLOUT}.dtype", "auto / bfloat16; float32 and float16: a warning (verl's actor is FSDP mixed "
                                  "precision)"),
    "checkpoint_every": ("trainer.save_freq", "0 -> -1 (verl saves at the end only)"),
    "keep_checkpoints": ("trainer.max_actor_ckpt_to_keep", "the last K only (verl keeps no best-by-pass@1): a warning"),
    "run_name": ("trainer.experiment_name", "project_name='brorl_lab'"),
    "report_to": ("trainer.logger", "console and file always; tensorboard, wandb"),
    "run_dir": ("-", "verl's checkpoints go to trainer.default_local_dir"),
    "engine": (f"{ROLLOUT}.name", "vllm (--rollout-engine sglang); our engines have no verl equivalent"),
    "ray_workers": ("trainer.nnodes, trainer.n_gpus_per_node", "--nodes, --gpus-per-node"),
    "ray_worker_engine": ("-", "verl places rollout replicas itself"),
    "ray_address": ("-", "`ray start` before launching: verl joins the cluster it finds"),
    "device": ("trainer.device", "cuda"),
    "rollout_chunk_sequences": ("-", "memory only: vllm batches itself"),
    "rollout_allocation": ("-", "uniform only: verl draws one rollout.n for every prompt (no per-prompt N; verl "
                                "#4585, closed unanswered); any other allocator is refused"),
    "allocation_probe": ("-", "with rollout_allocation only (refused on verl)"),
    "allocation_cap": ("-", "with rollout_allocation only (refused on verl)"),
    "allocation_round": ("-", "with rollout_allocation only (refused on verl)"),
    "allocation_prior_draws": ("-", "with rollout_allocation only (refused on verl)"),
    "logprob_layout": ("-", "same numbers in every layout"),
    "compile_step": ("-", "speed only, same numbers: verl's engines and actor bring their own fused kernels"),
    "torch_threads": ("-", "CPU threads of this process only"),
    "max_bad_steps": ("-", "verl has no non-finite-step guard"),
}


def _warn_unless(cond: bool, text: str, out: list[str]) -> None:
    if not cond:
        out.append(text)


def verl_overrides(cfg: Config, *, data_dir: str, model_path: str, max_prompt_length: int,
                   custom_chat_template: str | None, gpus_per_node: int = 8, nodes: int = 1,
                   rollout_engine: str = "vllm", total_epochs: int = 1000) -> tuple[dict[str, Any], list[str]]:
    """``({verl key: value}, warnings)`` for ``cfg``: the overrides verl's ``main_ppo`` needs to run the same
    experiment (data files under ``data_dir``: train.parquet, eval.parquet, reward.py), and one line per knob verl
    cannot express (see :data:`VERL_FIELDS`)."""
    if not isinstance(cfg, Config):
        raise ConfigError(f"cfg: got {type(cfg).__name__}; allowed: a brorl_lab Config")
    warnings: list[str] = []
    o: dict[str, Any] = {}
    # ---- data, model, rollout
    o["data.train_files"] = f"{data_dir}/train.parquet"
    o["data.val_files"] = f"{data_dir}/eval.parquet"
    o["data.prompt_key"] = "prompt"
    o["data.train_batch_size"] = cfg.prompts_per_step
    o["data.max_prompt_length"] = max_prompt_length
    o["data.max_response_length"] = cfg.max_new_tokens
    o["data.seed"] = cfg.seed
    o["data.shuffle"] = True
    o["actor_rollout_ref.model.path"] = model_path
    o["actor_rollout_ref.model.custom_chat_template"] = custom_chat_template
    o[f"{ROLLOUT}.name"] = rollout_engine
    o[f"{ROLLOUT}.n"] = cfg.rollouts_per_prompt
    o[f"{ROLLOUT}.temperature"] = cfg.temperature
    o[f"{ROLLOUT}.top_p"] = cfg.top_p
    o[f"{ROLLOUT}.seed"] = cfg.seed
    o[f"{ROLLOUT}.val_kwargs.n"] = cfg.eval_samples
    o[f"{ROLLOUT}.val_kwargs.do_sample"] = True
    o[f"{ROLLOUT}.val_kwargs.temperature"] = cfg.eval_temperature
    o[f"{ROLLOUT}.val_kwargs.top_p"] = cfg.eval_top_p
    if cfg.dtype in ("auto", "bfloat16"):
        o[f"{ROLLOUT}.dtype"] = "bfloat16"
    else:
        warnings.append(f"dtype={cfg.dtype!r}: verl's actor trains in FSDP mixed precision (bf16 compute, fp32 "
                        "master weights) and samples in bf16; dtype is not carried over")
    # ---- update
    if cfg.prompts_per_step % cfg.optimizer_steps_per_step:  # Config validates this; kept for a clear message
        raise ConfigError("optimizer_steps_per_step: must divide prompts_per_step")
    o[f"{ACTOR}.ppo_mini_batch_size"] = cfg.prompts_per_step // cfg.optimizer_steps_per_step
    o[f"{ACTOR}.ppo_epochs"] = 1
    o[f"{ACTOR}.use_dynamic_bsz"] = True
    o[f"{ACTOR}.ppo_max_token_len_per_gpu"] = max(cfg.train_micro_batch_tokens, max_prompt_length + cfg.max_new_tokens)
    o[f"{OPTIM}.lr"] = cfg.effective_lr
    o[f"{OPTIM}.lr_warmup_steps"] = cfg.lr_warmup_steps
    # verl's FSDP actor optimizer has constant and cosine (to min_lr_ratio=0 over the run, half a cycle) only
    o[f"{OPTIM}.lr_scheduler_type"] = "constant" if cfg.lr_scheduler_type == "linear" else cfg.lr_scheduler_type
    _warn_unless(cfg.lr_scheduler_type != "linear", "lr_scheduler_type='linear': verl's FSDP actor optimizer has "
                 "only 'constant' and 'cosine'; written as 'constant'", warnings)
    o[f"{OPTIM}.betas"] = list(cfg.adam_betas)
    o[f"{OPTIM}.weight_decay"] = cfg.weight_decay
    o[f"{OPTIM}.clip_grad"] = cfg.grad_clip
    o[f"{ACTOR}.grad_clip"] = cfg.grad_clip
    o["algorithm.adv_estimator"] = ADVANTAGES[cfg.advantage]
    o["algorithm.norm_adv_by_std_in_grpo"] = bool(cfg.adv_std_norm) and cfg.advantage == "grpo"
    o[f"{ACTOR}.policy_loss.loss_mode"] = POLICY_LOSSES[cfg.policy_loss]
    o[f"{ACTOR}.loss_agg_mode"] = LOSS_AGGREGATIONS[cfg.loss_agg]
    o[f"{ACTOR}.clip_ratio"] = cfg.eps_low
    o[f"{ACTOR}.clip_ratio_low"] = cfg.eps_low
    o[f"{ACTOR}.clip_ratio_high"] = cfg.eps_high
    o[f"{ACTOR}.entropy_coeff"] = cfg.entropy_coef
    kl_loss = cfg.kl_beta > 0 and cfg.kl_placement == "loss"
    kl_reward = cfg.kl_beta > 0 and cfg.kl_placement == "reward"
    o[f"{ACTOR}.use_kl_loss"] = kl_loss
    o[f"{ACTOR}.kl_loss_coef"] = cfg.kl_beta if kl_loss else 0.0
    o[f"{ACTOR}.kl_loss_type"] = KL_LOSS_TYPES[cfg.kl_estimator]
    o["algorithm.use_kl_in_reward"] = kl_reward
    o["algorithm.kl_penalty"] = KL_PENALTIES[cfg.kl_estimator]
    o["algorithm.kl_ctrl.type"] = "fixed"
    o["algorithm.kl_ctrl.kl_coef"] = cfg.kl_beta if kl_reward else 0.0
    if cfg.is_correction == "none":
        o[f"{RC}.rollout_is"] = None
    else:
        o[f"{RC}.rollout_is"] = "token"
        o[f"{RC}.rollout_is_threshold"] = (cfg.is_cap if cfg.is_correction == "truncate"
                                           else f"{cfg.icepop_low}_{cfg.icepop_high}")
    # ---- dynamic sampling (DAPO): main_ppo's algorithm.filter_groups, on our binary `correct` (acc)
    o["algorithm.filter_groups.enable"] = bool(cfg.dynamic_sampling)
    o["algorithm.filter_groups.metric"] = "acc"
    if cfg.dynamic_sampling and cfg.max_resample_rounds:
        warnings.append(f"max_resample_rounds={cfg.max_resample_rounds}: verl 0.9.1's replay buffer refills "
                        "filtered groups until train_batch_size is met, with no cap (max_num_gen_batches is ignored)")
    # ---- ProRL's reset: verl has no reference (or optimizer) reset
    resets = [f"{k}={getattr(cfg, k)}" for k in ("reset_every", "reset_every_samples", "reset_on_kl")
              if getattr(cfg, k)]
    if resets:
        what = "reference and optimizer reset" if cfg.reset_optimizer else "reference reset"
        warnings.append(f"{', '.join(resets)} (reset_optimizer={cfg.reset_optimizer}): verl 0.9.1 has no {what}; "
                        "its reference stays the initial policy (the nearest: stop, then start a new run from the "
                        "saved actor)")
    # ---- evaluation, loop, checkpoints, logging
    _warn_unless(list(cfg.eval_k) == [1], f"eval_k={list(cfg.eval_k)}: verl logs pass@1 (mean@n of acc); its "
                 "best@k is a bootstrap estimate, not the unbiased pass@k", warnings)
    o["trainer.total_training_steps"] = cfg.steps
    o["trainer.total_epochs"] = total_epochs
    freq = test_freq(cfg)
    if cfg.eval_at_steps:
        extra = sorted(eval_steps(freq, cfg.steps) - {s for s in range(1, cfg.steps + 1) if cfg.eval_due(s)})
        _warn_unless(not extra, f"eval_at_steps={list(cfg.eval_at_steps)}: verl evaluates every test_freq steps only; "
                     f"test_freq={freq} holds them all and adds evaluations at steps {_short(extra)}", warnings)
    for name in ("max_samples", "eval_at_samples"):
        _warn_unless(not getattr(cfg, name), f"{name}={getattr(cfg, name)}: verl 0.9.1 stops and evaluates on steps "
                     "only (total_training_steps, test_freq), not on generated samples", warnings)
    o["trainer.test_freq"] = freq if freq else -1
    o["trainer.val_before_train"] = bool(freq)
    o["trainer.save_freq"] = cfg.checkpoint_every if cfg.checkpoint_every else -1
    if cfg.keep_checkpoints:
        o["trainer.max_actor_ckpt_to_keep"] = cfg.keep_checkpoints
    _warn_unless(not cfg.keep_checkpoints, f"keep_checkpoints={cfg.keep_checkpoints}: verl keeps the last "
                 f"{cfg.keep_checkpoints} actor checkpoints (max_actor_ckpt_to_keep), not also the best by pass@1",
                 warnings)
    o["trainer.project_name"] = "brorl_lab"
    o["trainer.experiment_name"] = cfg.run_name or "verl"
    o["trainer.logger"] = ["console", "file", *[LOGGERS[t] for t in cfg.report_to if t in LOGGERS]]
    o["trainer.nnodes"] = nodes
    o["trainer.n_gpus_per_node"] = gpus_per_node
    o["trainer.device"] = "cuda"
    o[f"{ACTOR}.data_loader_seed"] = cfg.seed
    o["reward.custom_reward_function.path"] = f"{data_dir}/reward.py"
    o["reward.custom_reward_function.name"] = "compute_score"
    return o, warnings


def test_freq(cfg: Config) -> int:
    """verl's trainer.test_freq for our evaluation schedule: the gcd of eval_every and eval_at_steps (0: none)."""
    return math.gcd(cfg.eval_every, *cfg.eval_at_steps) if (cfg.eval_every or cfg.eval_at_steps) else 0


def eval_steps(freq: int, steps: int) -> set[int]:
    """The training steps verl evaluates after with test_freq=freq: every multiple, and the last step."""
    return {s for s in range(1, steps + 1) if s % freq == 0 or s == steps} if freq else set()


def _short(xs: list[int], n: int = 8) -> str:
    return ", ".join(map(str, xs[:n])) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")


# ---- Hydra's override grammar ----------------------------------------------------------------------------------------
def hydra_value(v: Any) -> str:
    """``v`` in Hydra's override grammar: null, true/false, numbers as Python writes them, lists in brackets, strings
    quoted (single quotes unless the string holds one; backslashes only matter before a quote and are escaped
    there)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, str):
        q = "'" if "'" not in v else '"'
        if q in v:
            raise ConfigError(f"hydra_value: got {v!r} with both quote characters; allowed: a string with at most one "
                              "kind of quote")
        # In a quoted Hydra string, backslashes are literal except a run of them right before the closing quote.
        body = v + "\\" * (len(v) - len(v.rstrip("\\")))
        return f"{q}{body}{q}"
    raise ConfigError(f"hydra_value: got {type(v).__name__}; allowed: None, bool, int, float, str or a list of them")


def override_lines(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` lines, one override each, as ``main_ppo`` takes them on its command line."""
    return [f"{k}={hydra_value(v)}" for k, v in overrides.items()]


def verl_table() -> str:
    """docs/ECOSYSTEM.md's "verl names" table (Markdown), from :data:`VERL_FIELDS`."""
    rows = ["| brorl_lab `Config` | verl 0.9.1 (`main_ppo` Hydra key) | note |", "| --- | --- | --- |"]
    rows += [f"| `{k}` | {'`' + key + '`' if key != '-' else '-'} | {note} |" for k, (key, note) in VERL_FIELDS.items()]
    return "\n".join(rows)
