"""TRL's names for our knobs: :meth:`Config.from_trl` reads a ``trl.GRPOConfig`` (TRL 1.16) into a :class:`Config`.

    from trl import GRPOConfig
    cfg = Config.from_trl(GRPOConfig(num_generations=16, beta=1e-3, epsilon_high=0.28), tasks=["gcd"])

What maps, maps (``num_generations`` -> ``rollouts_per_prompt``, ``beta`` -> ``kl_beta``, ...; the table is
:data:`TRL_FIELDS` and docs/ECOSYSTEM.md's "TRL names"). A GRPOConfig field that changes the algorithm but has no
equivalent here (``top_k``, ``mask_truncated_completions``, ``loss_type='cispo'``, ...) raises one
:class:`ConfigError` naming every such field set away from TRL's default: silently training something else than the
user asked for is worse than a refusal. Fields at their TRL default are not errors, and infrastructure fields
(logging, hub, vLLM server, dataloader) are ignored. The result is TRL's GRPO: no dynamic sampling (TRL has none),
KL estimator k3 in the loss (TRL's), the GRPO advantage.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brorl_lab.core.validation import ConfigError

#: TRL GRPOConfig field -> (our Config field, note). One row per line of docs/ECOSYSTEM.md's table.
TRL_FIELDS: dict[str, tuple[str, str]] = {
    "num_generations": ("rollouts_per_prompt", "N samples per prompt"),
    "generation_batch_size": ("prompts_per_step", "prompts_per_step = generation_batch_size / num_generations"),
    "steps_per_generation": ("optimizer_steps_per_step", "= steps_per_generation / gradient_accumulation_steps"),
    "learning_rate": ("lr", "the peak lr"),
    "warmup_steps": ("lr_warmup_steps", "linear warm-up"),
    "lr_scheduler_type": ("lr_scheduler_type", "constant (and constant_with_warmup), linear, cosine"),
    "adam_beta1": ("adam_betas[0]", ""),
    "adam_beta2": ("adam_betas[1]", ""),
    "weight_decay": ("weight_decay", ""),
    "max_grad_norm": ("grad_clip", ""),
    "beta": ("kl_beta", "k3 estimator in the loss, as TRL (kl_estimator='k3', kl_placement='loss')"),
    "epsilon": ("eps_low", ""),
    "epsilon_high": ("eps_high", "None in TRL means epsilon"),
    "temperature": ("temperature", ""),
    "top_p": ("top_p", ""),
    "max_completion_length": ("max_new_tokens", ""),
    "loss_type": ("loss_agg", "'dapo' -> token_mean, 'grpo' -> seq_mean_token_mean, 'dr_grpo' -> "
                              "seq_mean_token_sum_norm; others have no equivalent"),
    "scale_rewards": ("adv_std_norm", "'group'/True -> True, 'none'/False -> False ('batch' has no equivalent)"),
    "num_iterations": ("(one pass)", "1 only: each batch is used once, split into optimizer_steps_per_step"),
    "entropy_coef": ("entropy_coef", ""),
    "sync_ref_model": ("reset_every", "with ref_model_mixup_alpha=1 (ProRL's hard reset) every ref_model_sync_steps"),
    "max_steps": ("steps", "when > 0 (no epochs here)"),
    "seed": ("seed", ""),
    "bf16": ("dtype", "True -> 'bfloat16'"),
    "fp16": ("dtype", "True -> 'float16'"),
    "use_vllm": ("engine", "True -> 'vllm'"),
    "vllm_importance_sampling_mode": ("is_correction", "'token_truncate' -> 'truncate' (is_cap = clip_max), "
                                                       "'token_mask' -> 'icepop_mask'; sequence-level modes have no "
                                                       "equivalent"),
    "num_generations_eval": ("eval_samples", ""),
    "eval_steps": ("eval_every", "with eval_strategy='steps'"),
    "save_steps": ("checkpoint_every", "with save_strategy='steps'"),
    "output_dir": ("run_dir / run_name", "parent / name"),
    "report_to": ("report_to", "names of trackers we have"),
}

#: TRL / transformers TrainingArguments names a config file may hold that have an equivalent here but no
#: one-to-one value: refused with the translation (a config file cannot be read silently as something else).
TRL_EXPLAINED: dict[str, tuple[str, str]] = {
    "gradient_accumulation_steps": ("train_micro_batch_tokens", "accumulation is by tokens here: each of the "
                                    "optimizer_steps_per_step mini-batches is split into micro-batches of at most "
                                    "train_micro_batch_tokens tokens and their gradients summed; set "
                                    "optimizer_steps_per_step for TRL's steps_per_generation / "
                                    "gradient_accumulation_steps"),
    "save_total_limit": ("keep_checkpoints", "keep_checkpoints K keeps the last K checkpoints plus the best one "
                         "(TRL's save_total_limit with load_best_model_at_end); policy/ always holds the latest"),
    "per_device_train_batch_size": ("prompts_per_step", "a step's batch is prompts_per_step x rollouts_per_prompt "
                                    "samples"),
}

# Fields read by the mapping above besides TRL_FIELDS' keys (they qualify a mapped field).
_READ = {"gradient_accumulation_steps", "per_device_train_batch_size", "ref_model_mixup_alpha",
         "ref_model_sync_steps", "vllm_importance_sampling_correction", "vllm_importance_sampling_clip_max",
         "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap", "eval_strategy", "save_strategy",
         "run_name", "num_train_epochs", "use_bias_correction_kl"}

# GRPOConfig fields that change what is trained and have no equivalent: an error when set away from TRL's default.
UNSUPPORTED = ("top_k", "min_p", "repetition_penalty", "generation_kwargs", "delta", "importance_sampling_level",
               "reward_weights", "multi_objective_aggregation", "mask_truncated_completions", "top_entropy_quantile",
               "use_adaptive_entropy", "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos",
               "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "off_policy_mask_threshold",
               "max_tool_calling_iterations", "optim", "label_smoothing_factor", "disable_dropout",
               "cast_lm_head_to_fp32")

LOSS_TYPES = {"dapo": "token_mean", "grpo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm"}
SCALE_REWARDS = {"group": True, True: True, "none": False, False: False}
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup")


def _value(x: Any) -> str:
    """An enum's value (TRL's OptimizerNames, SchedulerType, IntervalStrategy) or the string itself."""
    return str(getattr(x, "value", x))


def config_kwargs_from_trl(trl_config: Any) -> dict:  # noqa: C901 - one branch per TRL field, in the order of docs/ECOSYSTEM.md's 'TRL names' table
    """Our Config fields for a ``trl.GRPOConfig`` (see module doc); raises one ConfigError for unsupported fields."""
    if not all(hasattr(trl_config, f) for f in ("num_generations", "beta", "epsilon", "learning_rate")):
        raise ConfigError(f"from_trl: got {type(trl_config).__name__}; allowed: a trl.GRPOConfig")
    t = trl_config
    # TRL's defaults on this machine: bf16 defaults to True and fails on a CPU unless use_cpu or bf16 says otherwise.
    default = type(t)(**{k: getattr(t, k) for k in ("bf16", "fp16", "use_cpu") if hasattr(t, k)})
    bad: list[str] = []

    def changed(name: str) -> bool:
        return hasattr(t, name) and getattr(t, name) != getattr(default, name)

    for name in UNSUPPORTED:
        if name == "optim":
            if not _value(getattr(t, "optim", "adamw_torch")).startswith("adamw_torch"):
                bad.append(f"optim={_value(t.optim)!r} (allowed: an adamw_torch variant)")
        elif changed(name):
            bad.append(f"{name}={getattr(t, name)!r}")

    out: dict[str, Any] = dict(
        rollouts_per_prompt=t.num_generations, lr=t.learning_rate, kl_beta=t.beta, eps_low=t.epsilon,
        eps_high=t.epsilon if t.epsilon_high is None else t.epsilon_high, temperature=t.temperature, top_p=t.top_p,
        max_new_tokens=t.max_completion_length, entropy_coef=t.entropy_coef, seed=t.seed,
        weight_decay=t.weight_decay, adam_betas=[t.adam_beta1, t.adam_beta2], grad_clip=t.max_grad_norm,
        lr_warmup_steps=int(t.warmup_steps or 0),
        # TRL's GRPO: no dynamic sampling, group-normalised advantage, k3 KL in the loss, PPO-clip.
        dynamic_sampling=False, advantage="grpo", kl_estimator="k3", kl_placement="loss", policy_loss="ppo_clip")
    if t.loss_type in LOSS_TYPES:
        out["loss_agg"] = LOSS_TYPES[t.loss_type]
    else:
        bad.append(f"loss_type={t.loss_type!r} (allowed: {', '.join(LOSS_TYPES)})")
    if t.scale_rewards in SCALE_REWARDS:
        out["adv_std_norm"] = SCALE_REWARDS[t.scale_rewards]
    else:
        bad.append(f"scale_rewards={t.scale_rewards!r} (allowed: 'group', 'none')")
    if t.num_iterations != 1:
        bad.append(f"num_iterations={t.num_iterations!r} (allowed: 1)")
    accum = max(1, int(getattr(t, "gradient_accumulation_steps", 1) or 1))
    spg = int(t.steps_per_generation or accum)
    gen_batch = int(t.generation_batch_size or t.per_device_train_batch_size * spg)
    if spg % accum or gen_batch % t.num_generations:
        bad.append(f"steps_per_generation={spg}, generation_batch_size={gen_batch} (allowed: a multiple of "
                   f"gradient_accumulation_steps={accum}, a multiple of num_generations={t.num_generations})")
    else:
        out.update(prompts_per_step=gen_batch // t.num_generations, optimizer_steps_per_step=spg // accum)
    schedule = _value(getattr(t, "lr_scheduler_type", "linear"))
    if schedule in CONSTANT_SCHEDULES:
        out["lr_scheduler_type"] = "constant"
    elif schedule in ("linear", "cosine"):
        out["lr_scheduler_type"] = schedule
    else:
        bad.append(f"lr_scheduler_type={schedule!r} (allowed: 'constant', 'constant_with_warmup', 'linear', "
                   "'cosine')")
    if t.sync_ref_model:
        if t.ref_model_mixup_alpha == 1.0:
            out["reset_every"] = t.ref_model_sync_steps
        else:
            bad.append(f"sync_ref_model=True with ref_model_mixup_alpha={t.ref_model_mixup_alpha!r} (allowed: 1.0, "
                       "ProRL's hard reset)")
    if getattr(t, "max_steps", -1) and t.max_steps > 0:
        out["steps"] = t.max_steps
    if getattr(t, "fp16", False):
        out["dtype"] = "float16"
    elif getattr(t, "bf16", False) and not getattr(t, "use_cpu", False):
        out["dtype"] = "bfloat16"
    if t.use_vllm:
        out["engine"] = "vllm"
        if t.vllm_importance_sampling_correction:
            mode = t.vllm_importance_sampling_mode
            cap = t.vllm_importance_sampling_clip_max or t.vllm_importance_sampling_cap
            if mode == "token_truncate":
                out.update(is_correction="truncate", **({"is_cap": cap} if cap else {}))
            elif mode == "token_mask":
                out.update(is_correction="icepop_mask", **({"icepop_high": cap} if cap else {}))
                if t.vllm_importance_sampling_clip_min:
                    out["icepop_low"] = t.vllm_importance_sampling_clip_min
            else:
                bad.append(f"vllm_importance_sampling_mode={mode!r} (allowed: 'token_truncate', 'token_mask', or "
                           "vllm_importance_sampling_correction=False)")
    if t.num_generations_eval is not None:
        out["eval_samples"] = t.num_generations_eval
    if _value(getattr(t, "eval_strategy", "no")) == "steps" and getattr(t, "eval_steps", None):
        out["eval_every"] = int(t.eval_steps)
    if _value(getattr(t, "save_strategy", "steps")) == "steps" and getattr(t, "save_steps", None):
        out["checkpoint_every"] = int(t.save_steps)
    if t.output_dir and t.output_dir != "trainer_output":
        from pathlib import Path

        out.update(run_dir=str(Path(t.output_dir).parent), run_name=Path(t.output_dir).name)
    report = getattr(t, "report_to", None)
    report = [] if report in (None, "none", ["none"]) else [report] if isinstance(report, str) else list(report)
    if report == ["all"]:
        bad.append("report_to='all' (allowed: a list of tracker names)")
        report = []
    if report:
        out["report_to"] = report  # Config validates the names against the tracker registry
    if bad:
        raise ConfigError("from_trl: GRPOConfig fields with no brorl_lab equivalent are set away from TRL's default: "
                          f"{'; '.join(bad)}; allowed: TRL's defaults for these (see docs/ECOSYSTEM.md, 'TRL names')")
    return out


#: TRL names a config file may use for one of our fields with the same meaning and value: read as ours, with a note.
TRL_ALIASES = {"num_generations": "rollouts_per_prompt", "learning_rate": "lr", "warmup_steps": "lr_warmup_steps",
               "max_grad_norm": "grad_clip", "beta": "kl_beta", "epsilon": "eps_low", "epsilon_high": "eps_high",
               "max_completion_length": "max_new_tokens", "max_steps": "steps", "num_generations_eval": "eval_samples"}


def apply_trl_aliases(data: dict, source: str, field_names: Collection[str]) -> tuple[dict, list[str]]:
    """A config file's fields with TRL's names (:data:`TRL_ALIASES`) read as ours, and the notes saying so. A TRL
    name whose value means something else here (``generation_batch_size``, ``loss_type``, ``save_total_limit``,
    ...) is one ConfigError with the hint from :data:`TRL_FIELDS` / :data:`TRL_EXPLAINED`; so is a field given under
    both names. ``field_names``: our Config's fields (passed in: this module sits below config.py)."""
    ours = set(field_names)
    out, notes = dict(data), []
    for trl, name in TRL_ALIASES.items():
        if trl in out and trl not in ours:
            if name in out:
                raise ConfigError(f"{source}: both {trl!r} (TRL's name) and {name!r}; allowed: one of them")
            out[name] = out.pop(trl)
            notes.append(f"note: {source}: {trl} (TRL's name) read as {name}")
    for key in out:
        if key in {**TRL_FIELDS, **TRL_EXPLAINED} and key not in ours:
            target, note = {**TRL_FIELDS, **TRL_EXPLAINED}[key]
            raise ConfigError(f"{source}: field {key!r} is TRL's name; here: {target}" + (f" ({note})" if note else "")
                              + "; allowed: our field names (docs/runs.md 'TRL names'), or Config.from_trl")
    return out, notes
