"""`RolloutBatch`: the object that flows through one RL step (rollout -> score -> filter -> advantages -> update).

Layout is prompt-major: sample ``b = p * n + s`` is sample ``s`` of prompt ``p``, so any per-sample tensor ``x`` of
shape ``[P*N]`` views as groups with ``x.view(P, N)`` (see :meth:`RolloutBatch.grouped`).

Groups may also differ in size (a per-prompt allocation of the rollout budget, :mod:`brorl_lab.rl.allocation`):
then ``sizes`` [P] holds each prompt's N_p, the rows are still prompt-major (prompt p's samples are rows
``offsets[p] .. offsets[p+1]-1`` with ``offsets = [0, cumsum(sizes)]``), ``n`` is the largest group, and per-group
reductions go through :meth:`RolloutBatch.group_mean` / :meth:`RolloutBatch.group_sum` instead of ``grouped``.
A batch whose groups are all the same size is always stored uniform (``sizes=None``), so a uniform run never takes
the ragged code path.

    batch = rollout(engine, items, n=16)       # engines fill tokens, logprobs, lengths, texts
    batch = score(batch)                       # rewards fill `rewards` and `correct`
    batch.to_pandas().head()                   # or just display `batch` in Jupyter for an HTML table
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch


@dataclass
class RolloutBatch:
    prompts: list  # [P] prompt strings as given to the engine
    prompt_ids: list  # [P] lists of prompt token ids (the trainer re-runs prompt + response)
    n: int  # rollouts per prompt (N)
    response_ids: torch.Tensor  # [P*N, T] long, padded with `pad_id` past each length
    logprobs: torch.Tensor  # [P*N, T] float32, engine's log pi(token) at the sampling temperature, 0 on padding
    lengths: torch.Tensor  # [P*N] long, response tokens including a generated EOS
    truncated: torch.Tensor  # [P*N] bool, hit max_new_tokens without EOS
    texts: list  # [P*N] decoded responses (special tokens stripped)
    pad_id: int = 0
    items: Optional[list] = None  # [P] task items (tasks.TaskItem) the prompts came from, used by score()
    rewards: Optional[torch.Tensor] = None  # [P*N] float32
    correct: Optional[torch.Tensor] = None  # [P*N] bool
    meta: dict = field(default_factory=dict)  # engine name, sampling settings, timings
    sizes: Optional[torch.Tensor] = None  # [P] long, each prompt's group size N_p; None: every group has n

    def __post_init__(self):
        if self.sizes is None:
            return
        sizes = torch.as_tensor(self.sizes, dtype=torch.long).reshape(-1)  # [P]
        if sizes.numel() != len(self.prompts):
            raise ValueError(f"RolloutBatch.sizes: {sizes.numel()} group sizes for {len(self.prompts)} prompts")
        if sizes.numel() and int(sizes.min()) < 1:
            raise ValueError("RolloutBatch.sizes: every group needs at least 1 sample")
        if sizes.numel() == 0 or bool((sizes == sizes[0]).all()):  # canonical: equal groups are stored uniform
            self.n, self.sizes = (int(sizes[0]) if sizes.numel() else self.n), None
        else:
            self.n, self.sizes = int(sizes.max()), sizes

    # ---- shape helpers --------------------------------------------------------------------------------------------
    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def is_ragged(self) -> bool:
        """Whether groups differ in size (``sizes`` set); a uniform batch has every group of size ``n``."""
        return self.sizes is not None

    @property
    def group_sizes(self) -> torch.Tensor:  # [P] long
        return self.sizes if self.sizes is not None else torch.full((self.num_prompts,), self.n, dtype=torch.long)

    @property
    def group_offsets(self) -> torch.Tensor:  # [P+1] long, prompt p's rows are offsets[p] .. offsets[p+1]-1
        return torch.cat([torch.zeros(1, dtype=torch.long), self.group_sizes.cumsum(0)])

    @property
    def size(self) -> int:
        return int(self.sizes.sum()) if self.sizes is not None else self.num_prompts * self.n

    def __len__(self) -> int:
        return self.size

    @property
    def prompt_index(self) -> torch.Tensor:  # [P*N] (ragged: [sum_p N_p])
        if self.sizes is not None:
            return torch.arange(self.num_prompts).repeat_interleave(self.sizes)
        return torch.arange(self.num_prompts).repeat_interleave(self.n)

    @property
    def sample_index(self) -> torch.Tensor:  # [P*N] (ragged: [sum_p N_p])
        if self.sizes is not None:
            return torch.arange(self.size) - self.group_offsets[:-1].repeat_interleave(self.sizes)
        return torch.arange(self.n).repeat(self.num_prompts)

    @property
    def response_mask(self) -> torch.Tensor:  # [P*N, T] bool, True on real response tokens
        t = torch.arange(self.response_ids.shape[1])
        return t[None, :] < self.lengths[:, None]

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """View a per-sample tensor [P*N, ...] as groups [P, N, ...] (uniform batches only: groups of unequal size
        have no [P, N] view; use :meth:`group_sum` / :meth:`group_mean`)."""
        if self.sizes is not None:
            raise ValueError("RolloutBatch.grouped: this batch's groups differ in size (sizes="
                             f"{self.sizes.tolist()[:8]}...); allowed: a uniform batch, or group_sum / group_mean")
        return x.view(self.num_prompts, self.n, *x.shape[1:])

    def group_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per-group sums [P, ...] of a per-sample tensor [sum_p N_p, ...] (any group sizes)."""
        if self.sizes is None:
            return self.grouped(x).sum(1)
        out = torch.zeros((self.num_prompts, *x.shape[1:]), dtype=x.dtype if x.is_floating_point() else torch.long)
        return out.index_add_(0, self.prompt_index, x.to(out.dtype))

    def group_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Per-group means [P, ...] of a per-sample tensor [sum_p N_p, ...]: sum_s x_{p,s} / N_p."""
        if self.sizes is None:
            return self.grouped(x).mean(1)
        x = x if x.is_floating_point() else x.float()
        return self.group_sum(x) / self.sizes.to(x.dtype).reshape(-1, *([1] * (x.ndim - 1)))

    def group(self, p: int) -> "RolloutBatch":
        """The N samples of prompt ``p`` as a batch of one prompt."""
        return self.select_prompts([p])

    def rows_of(self, prompts: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Row indices [len(prompts)*N] of all samples of the given prompts, prompt-major, in the given order."""
        prompts = torch.as_tensor(prompts, dtype=torch.long).reshape(-1)
        if self.sizes is not None:
            off = self.group_offsets
            return torch.cat([torch.arange(int(off[p]), int(off[p + 1])) for p in prompts.tolist()]
                             or [torch.zeros(0, dtype=torch.long)])
        return (prompts[:, None] * self.n + torch.arange(self.n)[None, :]).reshape(-1)

    def select_prompts(self, keep: Sequence[int] | torch.Tensor) -> "RolloutBatch":
        """A batch with only the given prompts (and all their samples), in the given order."""
        keep = torch.as_tensor(keep, dtype=torch.long).reshape(-1)
        rows = self.rows_of(keep)  # [len(keep)*N]
        pick = lambda xs: [xs[i] for i in keep.tolist()]  # noqa: E731
        take = lambda t: None if t is None else t[rows]  # noqa: E731
        return replace(
            self,
            prompts=pick(self.prompts),
            prompt_ids=pick(self.prompt_ids),
            items=None if self.items is None else pick(self.items),
            response_ids=self.response_ids[rows],
            logprobs=self.logprobs[rows],
            lengths=self.lengths[rows],
            truncated=self.truncated[rows],
            texts=[self.texts[i] for i in rows.tolist()],
            rewards=take(self.rewards),
            correct=take(self.correct),
            meta=dict(self.meta),
            sizes=None if self.sizes is None else self.sizes[keep],
        )

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """Join batches (e.g. dynamic-sampling refill rounds) into one, prompts in order. Batches of different
        group sizes join into a batch with ``sizes`` set (groups of unequal size)."""
        batches = [b for b in batches if b.num_prompts > 0] or list(batches[:1])
        if not batches:
            raise ValueError("RolloutBatch.concat: got no batches")
        ragged = any(b.sizes is not None for b in batches) or len({b.n for b in batches}) != 1
        width = max(b.response_ids.shape[1] for b in batches)

        def pad(t: torch.Tensor, value) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        def cat_opt(name):
            vals = [getattr(b, name) for b in batches]
            return None if any(v is None for v in vals) else torch.cat(vals)

        first = batches[0]
        return replace(
            first,
            prompts=[p for b in batches for p in b.prompts],
            prompt_ids=[p for b in batches for p in b.prompt_ids],
            items=None if any(b.items is None for b in batches) else [i for b in batches for i in b.items],
            response_ids=torch.cat([pad(b.response_ids, first.pad_id) for b in batches]),
            logprobs=torch.cat([pad(b.logprobs, 0.0) for b in batches]),
            lengths=torch.cat([b.lengths for b in batches]),
            truncated=torch.cat([b.truncated for b in batches]),
            texts=[t for b in batches for t in b.texts],
            rewards=cat_opt("rewards"),
            correct=cat_opt("correct"),
            meta=dict(first.meta),
            sizes=torch.cat([b.group_sizes for b in batches]) if ragged else None,
        )

    def validate(self) -> "RolloutBatch":
        """Check shapes and invariants; returns self so engines can ``return batch.validate()``."""
        B = self.size
        if len(self.prompt_ids) != self.num_prompts:
            raise ValueError(f"RolloutBatch: {len(self.prompt_ids)} prompt_ids for {self.num_prompts} prompts")
        if self.response_ids.ndim != 2 or self.response_ids.shape[0] != B:
            raise ValueError(f"RolloutBatch.response_ids: shape {tuple(self.response_ids.shape)}, expected [{B}, T]")
        if self.logprobs.shape != self.response_ids.shape:
            raise ValueError(f"RolloutBatch.logprobs: shape {tuple(self.logprobs.shape)} != response_ids "
                             f"{tuple(self.response_ids.shape)}")
        for name in ("lengths", "truncated"):
            if getattr(self, name).shape != (B,):
                raise ValueError(f"RolloutBatch.{name}: shape {tuple(getattr(self, name).shape)}, expected [{B}]")
        if len(self.texts) != B:
            raise ValueError(f"RolloutBatch.texts: {len(self.texts)} texts for {B} samples")
        if B and (self.lengths.min() < 0 or self.lengths.max() > self.response_ids.shape[1]):
            raise ValueError("RolloutBatch.lengths: outside [0, T]")
        return self

    # ---- display --------------------------------------------------------------------------------------------------
    def to_pandas(self):
        """One row per sample: prompt/sample index, text, length, truncated, sum logprob, reward, correct."""
        import pandas as pd

        mask = self.response_mask
        data: dict[str, Any] = {
            "prompt_index": self.prompt_index.numpy(),
            "sample_index": self.sample_index.numpy(),
            "prompt": [self.prompts[p] for p in self.prompt_index.tolist()],
            "response": self.texts,
            "length": self.lengths.numpy(),
            "truncated": self.truncated.numpy(),
            "logprob_sum": (self.logprobs * mask).sum(1).numpy(),
        }
        if self.rewards is not None:
            data["reward"] = self.rewards.numpy()
        if self.correct is not None:
            data["correct"] = self.correct.numpy()
        return pd.DataFrame(data)

    def summary(self) -> dict:
        """Plain numbers for a metrics row."""
        sizes = self.group_sizes.float()
        out = {"prompts": self.num_prompts, "samples": self.size,
               "rollouts_per_prompt": float(sizes.mean()) if self.is_ragged else self.n,
               "response_length_mean": float(self.lengths.float().mean()) if self.size else 0.0,
               "response_length_max": int(self.lengths.max()) if self.size else 0,
               "truncation_rate": float(self.truncated.float().mean()) if self.size else 0.0}
        if self.rewards is not None and self.size:
            out["reward_mean"] = float(self.rewards.mean())
        if self.correct is not None and self.size:
            out["pass_at_1"] = float(self.correct.float().mean())
        if self.is_ragged:
            out["rollouts_per_prompt_max"] = self.n
        return out

    def __repr__(self) -> str:
        s = self.summary()
        n = f"n={s['rollouts_per_prompt']:.1f} (mean; max {self.n})" if self.is_ragged else f"n={self.n}"
        return (f"RolloutBatch(prompts={s['prompts']}, {n}, samples={s['samples']}, "
                f"T={self.response_ids.shape[1]}, mean_len={s['response_length_mean']:.1f}"
                + (f", pass@1={s['pass_at_1']:.3f}" if "pass_at_1" in s else "") + ")")

    def _repr_html_(self, samples_per_prompt: int = 3, max_prompts: int = 4) -> str:
        df = self.to_pandas()
        df = df[(df.sample_index < samples_per_prompt) & (df.prompt_index < max_prompts)]
        for col in ("prompt", "response"):  # DataFrame.to_html has no max_colwidth: cut long texts here
            df[col] = [t if len(t) <= 80 else t[:79] + "…" for t in df[col]]
        return (f"<p><b>{html.escape(repr(self))}</b> (showing {samples_per_prompt} samples of the first "
                f"{max_prompts} prompts)</p>" + df.to_html(index=False))


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [P, L], attention_mask [P, L])`` with each sequence right-aligned, so all prompts end at column L-1
    and the first sampled token of every row is predicted at the same column."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, L - len(s):] = torch.as_tensor(s, dtype=torch.long)
            mask[i, L - len(s):] = 1
    return ids, mask
