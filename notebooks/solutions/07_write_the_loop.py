"""Reference solutions of notebook 07's exercises (kept apart from the notebook: try them yourself first).

Loaded only when the notebook runs with ``use_solutions=True`` (the tests and the book do; see
``brorl_lab.lab.course.Exercises``). Each function has the name and signature of the notebook's stub. None of them
calls the library function its check compares against.
"""

import torch


def response_logprobs(logits, input_ids, prompt_len):
    """log pi(x_t | x_<t) of the response tokens t >= prompt_len: the logits at t - 1 predict token t.

    logits [b, L, V], input_ids [b, L] -> [b, L - prompt_len]."""
    log_probs = torch.log_softmax(logits[:, prompt_len - 1:-1], dim=-1)       # [b, L - prompt_len, V]
    targets = input_ids[:, prompt_len:]                                       # [b, L - prompt_len]
    return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def grpo_advantage(rewards, eps=1e-6):
    """(r - group mean) / (group std with N - 1 + eps); a uniform group (a group of one too) is exactly 0. [P, N]."""
    n = rewards.shape[1]
    mean = rewards.sum(dim=1, keepdim=True) / n                               # [P, 1]
    var = ((rewards - mean) ** 2).sum(dim=1, keepdim=True) / max(n - 1, 1)    # [P, 1]
    uniform = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)            # [P, 1]
    return torch.where(uniform, torch.zeros_like(rewards), (rewards - mean) / (var.sqrt() + eps))


def rloo_advantage(rewards):
    """r_i minus the mean of the other N - 1 rewards of its group; a uniform group (a group of one too) is 0."""
    n = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / max(n - 1, 1)     # [P, N] leave-one-out mean
    uniform = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)            # [P, 1]
    return torch.where(uniform, torch.zeros_like(rewards), rewards - others)


def ppo_clip_loss(logp, old_logp, advantages, mask, eps_low, eps_high):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), averaged over the real tokens (mask True). Scalar."""
    ratio = torch.exp(torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp)))   # [b, T]
    a = advantages.detach()[:, None]                                                           # [b, 1]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)  # [b, T]
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1)


def kl_estimate(logp, ref_logp, kind):
    """Per-token estimates of KL(pi || pi_ref) on tokens drawn from pi; d = log pi - log pi_ref. [b, T]."""
    d = logp - ref_logp.detach()
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.clamp(-10, 10) ** 2
    if kind == "k3":                     # rho = pi_ref / pi = exp(-d): (rho - 1) - log rho; expm1 keeps small d exact
        return torch.expm1(-d) + d
    raise ValueError(f"kind: got {kind!r}; allowed: 'k1', 'k2', 'k3'")


def spell_backward_reward(response, item):
    """1.0 when the first non-empty line of the response, stripped, is the word spelled backward (any case)."""
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return float(bool(lines) and lines[0].lower() == item.answer.lower())


def keep_groups(correct):
    """Dynamic sampling: keep a group [P] iff it holds at least one right and one wrong answer (correct [P, N])."""
    n_right = correct.sum(dim=1)                                              # [P]
    return (n_right > 0) & (n_right < correct.shape[1])
