"""Q_pos of a prompt, exactly: the probability the policy generates an accepted answer, by teacher forcing.

For a prompt x, the sampler (temperature tau, top_p = 1) draws a response y token by token until EOS. With A(x) the
set of *accepted answer strings* and, for a string a, T(a) the set of token sequences that decode to a,

    Q_pos(x) = sum_{a in A(x)} sum_{y in T(a)} prod_t softmax(z_t / tau)[y_t]  *  softmax(z_|y| / tau)[EOS]

(one forward over every candidate ``y + [EOS]`` of many prompts, :func:`candidate_logprobs`, with the trainer's own
log-prob code, :func:`brorl_lab.rl.logprobs.token_logprobs`). It is the one-token theory's correct mass Q_pos for
the whole response: the number BroRL's Theorem 1 says an update moves (``docs/THEORY.md``).

Which strings are enumerated (:func:`accepted_answers`). The plain template's verifier takes the first non-empty
line of the response, stripped, and hands it to the family's checker. So a response is accepted iff its first line
is ``w + a + w'`` for whitespace w, w' and an answer ``a`` the checker accepts. We enumerate

- leading whitespace ``w`` in ``LEADING`` ('', ' ', '  '; the model is trained on ' ' + answer), no trailing
  whitespace and nothing after the answer but EOS;
- answer forms: the reference; for ``spell_backward`` every upper/lower-case variant (reasoning-gym compares
  lower-cased strings); for ``chain_sum``/``products`` (reasoning-gym's decimal reward: sign, leading zeros and
  trailing decimals tolerated) '+a' for a >= 0 and 'a.0'; for ``simple_equations`` (math-verify) 'a.0' and 'x = a';
- each candidate string is kept only if the family's own ``score`` marks it correct (so the set is checked, never
  assumed).

What is not enumerated (unbounded): anything after a newline that ends the first line, trailing spaces, more
leading zeros. :func:`coverage` measures how much of the sampled pass rate falls outside the set (the test and the
study report it; with the shipped models it is below 0.5%).

Tokenisations. A byte-level BPE vocabulary can spell one string several ways (this tokenizer has merges such as
'Ġt' and 'Ġan', so ' tac' is both ['Ġt', 'a', 'c'] and ['Ġ', 't', 'a', 'c']); the sampler may emit any of them and
the verifier sees only the decoded text, so :func:`tokenisations` enumerates every segmentation of the string into
vocabulary tokens (special tokens excluded) and each becomes a candidate. Digits are single tokens here (the
pre-tokenizer isolates them), so numbers have one spelling per whitespace prefix.

Special tokens. The decoder drops special tokens, so a sampled ``<|pad|>`` in the middle of an answer would still
read as the answer; :func:`special_token_mass` measures that probability (about 1e-6 on the shipped models) and
it is left out of Q_pos.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from brorl_lab.core.batch import RolloutBatch, left_pad
from brorl_lab.rl.logprobs import plan_micro_batches, token_logprobs
from brorl_lab.rollout.engines.common import encode_prompts, special_ids
from brorl_lab.rollout.rewards import score_response
from brorl_lab.rollout.tasks import TASKS, TaskItem

LEADING = ("", " ", "  ")  # whitespace before the answer (the extractor strips it)
MAX_TOKENISATIONS = 256  # per string; a string with more spellings is an error (a real model's long answer)

__all__ = ["LEADING", "accepted_answers", "tokenisations", "AnswerCandidates", "answer_candidates",
           "candidate_logprobs", "q_pos", "q_pos_tensor", "first_token_problem", "special_token_mass", "coverage"]


# ---- which strings -----------------------------------------------------------------------------------------------
def _answer_forms(item: TaskItem) -> list[str]:
    a = item.answer.strip()
    forms = [a]
    if item.family == "spell_backward" and len(a) <= 8:  # reasoning-gym lower-cases both sides
        forms += ["".join(c) for c in itertools.product(*[(ch.lower(), ch.upper()) for ch in a])]
    elif item.family in ("chain_sum", "products"):  # compute_decimal_reward: '+', trailing decimals
        forms += ([f"+{a}"] if not a.startswith("-") else []) + [f"{a}.0"]
    elif item.family == "simple_equations":  # math-verify: 13.0 and x = 13 both equal 13
        forms += [f"{a}.0", f"x = {a}"]
    return list(dict.fromkeys(forms))


def accepted_answers(item: TaskItem, template: str = "plain") -> list[str]:
    """The response strings (before EOS) Q_pos sums over: ``LEADING`` whitespace x the family's answer forms
    (module docstring), each kept only if the family's verifier marks it correct."""
    if not isinstance(item, TaskItem):
        raise ValueError(f"item: got {type(item).__name__}; allowed: a brorl_lab.rollout.tasks.TaskItem")
    if template != "plain":
        raise ValueError(f"template: got {template!r}; allowed: 'plain' (chat answers are free text: "
                         "Q_pos is not enumerable there)")
    out = [w + f for f in _answer_forms(item) for w in LEADING]
    return [s for s in dict.fromkeys(out) if score_response(s, item, template).correct]


_BYTE_TO_UNICODE: Optional[dict[int, str]] = None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are written in ('Ġ' = space)."""
    global _BYTE_TO_UNICODE
    if _BYTE_TO_UNICODE is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
            list(range(ord("®"), ord("ÿ") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_TO_UNICODE = {b: chr(c) for b, c in zip(bs, cs)}
    return _BYTE_TO_UNICODE


def tokenisations(text: str, tokenizer, *, limit: int = MAX_TOKENISATIONS) -> list[list[int]]:
    """Every token sequence (no special tokens) that decodes to ``text``: all segmentations of its byte-level
    spelling into vocabulary entries. Each is checked by decoding it. More than ``limit`` is an error."""
    if not text:
        return [[]]
    m = _bytes_to_unicode()
    s = "".join(m[b] for b in text.encode("utf-8"))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = {t: i for t, i in tokenizer.get_vocab().items() if i not in special}
    longest = max(map(len, vocab))
    ways: list[list[list[int]]] = [[] for _ in range(len(s) + 1)]  # ways[i]: segmentations of s[i:]
    ways[len(s)] = [[]]
    for i in range(len(s) - 1, -1, -1):
        for j in range(i + 1, min(len(s), i + longest) + 1):
            tid = vocab.get(s[i:j])
            if tid is not None:
                ways[i].extend([tid, *rest] for rest in ways[j])
        if len(ways[i]) > limit:
            raise ValueError(f"text: {text!r} has more than {limit} tokenisations; allowed: short answers "
                             "(raise limit for a vocabulary with many merges)")
    for seq in ways[0]:
        if tokenizer.decode(seq) != text:
            raise AssertionError(f"tokenisation {seq} of {text!r} decodes to {tokenizer.decode(seq)!r}")
    return ways[0]


# ---- candidates -----------------------------------------------------------------------------------------------
@dataclass
class AnswerCandidates:
    """Every candidate response ``y + [EOS]`` of P prompts, prompt-major in a RolloutBatch of n = the largest
    candidate count; ``weight`` [P*n] is 1 on real candidates and 0 on the padding rows (copies of a prompt's first
    candidate) that fill each prompt up to n. ``strings`` [P*n] names each row's answer text."""

    batch: RolloutBatch
    weight: torch.Tensor  # [P*n] float32
    strings: list
    first_tokens: list  # [P] sets of token ids that start an accepted candidate (after the shared prefix)

    @property
    def num_prompts(self) -> int:
        return self.batch.num_prompts


def answer_candidates(items: Sequence[TaskItem], tokenizer, *, template: str = "plain") -> AnswerCandidates:
    """Build the candidates of ``items`` (prompt formatted with ``template``, as the trainer's rollout does)."""
    if not items:
        raise ValueError("items: got no items; allowed: a non-empty list of TaskItem")
    eos_ids, pad = special_ids(tokenizer)
    prompts = [TASKS[it.family].format_prompt(it, template, tokenizer) for it in items]
    per_prompt = []
    for it in items:
        rows = [(s, seq + [e]) for s in accepted_answers(it, template) for seq in tokenisations(s, tokenizer)
                for e in eos_ids]
        if not rows:
            raise ValueError(f"items: {it.uid} has no accepted answer its verifier marks correct")
        per_prompt.append(rows)
    n = max(map(len, per_prompt))
    T = max(len(y) for rows in per_prompt for _, y in rows)
    ids = torch.full((len(items) * n, T), pad, dtype=torch.long)
    lengths = torch.zeros(len(items) * n, dtype=torch.long)
    weight = torch.zeros(len(items) * n)
    strings = []
    for p, rows in enumerate(per_prompt):
        for k in range(n):
            s, y = rows[k] if k < len(rows) else rows[0]
            ids[p * n + k, :len(y)] = torch.tensor(y)
            lengths[p * n + k] = len(y)
            weight[p * n + k] = float(k < len(rows))
            strings.append(s)
    batch = RolloutBatch(prompts=prompts, prompt_ids=encode_prompts(tokenizer, prompts), n=n, response_ids=ids,
                         logprobs=torch.zeros(ids.shape), lengths=lengths,
                         truncated=torch.zeros(len(lengths), dtype=torch.bool), texts=strings, pad_id=pad,
                         items=list(items), meta={"kind": "answer candidates"}).validate()
    firsts = [sorted({y[0] for _, y in rows}) for rows in per_prompt]
    return AnswerCandidates(batch, weight, strings, firsts)


def candidate_logprobs(model: torch.nn.Module, cands: AnswerCandidates, *, temperature: float,
                       micro_batch_tokens: int = 8192) -> torch.Tensor:
    """log P(y + EOS | prompt) [P*n] of every candidate row, summed over its tokens (differentiable when called
    outside ``no_grad``: the first-order test takes its gradient). One forward per micro-batch, each prompt once
    (the trainer's shared-prefix layout)."""
    b = cands.batch
    out = []
    order = []
    for rows in plan_micro_batches(model, b, torch.arange(b.size), micro_batch_tokens, "auto"):
        lp, _ = token_logprobs(model, b, rows, temperature=temperature)  # [r, T], 0 on padding
        out.append(lp.sum(1))
        order.append(rows)
    back = torch.argsort(torch.cat(order))
    return torch.cat(out)[back.to(out[0].device)]


def q_pos_tensor(model: torch.nn.Module, cands: AnswerCandidates, *, temperature: float,
                 micro_batch_tokens: int = 8192) -> torch.Tensor:
    """Q_pos [P] = sum over each prompt's candidates of P(y + EOS | prompt); differentiable (float32)."""
    lp = candidate_logprobs(model, cands, temperature=temperature, micro_batch_tokens=micro_batch_tokens)
    w = cands.weight.to(lp.device)
    return (lp.exp() * w).view(cands.num_prompts, cands.batch.n).sum(1)


@torch.no_grad()
def q_pos(model: torch.nn.Module, tokenizer, items: Sequence[TaskItem], *, temperature: float,
          template: str = "plain", micro_batch_tokens: int = 8192,
          cands: Optional[AnswerCandidates] = None) -> np.ndarray:
    """Exact Q_pos [P] (float64 numpy) of ``items`` under ``model`` at ``temperature`` (top_p = 1); pass ``cands``
    from :func:`answer_candidates` to reuse them across models (before and after an update)."""
    cands = cands if cands is not None else answer_candidates(items, tokenizer, template=template)
    lp = candidate_logprobs(model, cands, temperature=temperature, micro_batch_tokens=micro_batch_tokens)
    p = lp.double().exp().cpu() * cands.weight.double()
    return p.view(cands.num_prompts, cands.batch.n).sum(1).numpy()


# ---- the one-token view ---------------------------------------------------------------------------------------
def _is_space(tokenizer, tid: int) -> bool:
    return tokenizer.decode([tid]).strip() == ""


@torch.no_grad()
def first_token_problem(model: torch.nn.Module, tokenizer, item: TaskItem, *, temperature: float,
                        template: str = "plain") -> dict:
    """The one-token problem of Theorem 1 at a prompt's *first answer position*: the response position right after
    the leading whitespace tokens of the reference's canonical spelling (' 57' -> ['Ġ', '5', '7']: after 'Ġ';
    ' tac' -> ['Ġt', ...]: position 0). Returns ``logits`` [V] (already divided by temperature, so
    softmax(logits) is the sampler's distribution), ``correct`` [V] bool (the tokens at that position that start an
    accepted candidate, whitespace-only tokens excluded: they start wrong answers as well), ``context`` (the
    response tokens before the position), ``ambiguous_mass`` (probability of whitespace-only tokens there) and
    ``q_pos_first`` (the correct set's probability, the one-token Q_pos)."""
    canonical = tokenizer(" " + item.answer.strip(), add_special_tokens=False)["input_ids"] \
        if template == "plain" else []
    context = list(itertools.takewhile(lambda t: _is_space(tokenizer, t), canonical))
    prompt = TASKS[item.family].format_prompt(item, template, tokenizer)
    ids = torch.tensor([encode_prompts(tokenizer, [prompt])[0] + context])
    device = next(model.parameters()).device
    z = model(input_ids=ids.to(device)).logits[0, -1].float().cpu() / temperature  # [V]
    correct = torch.zeros(z.shape[0], dtype=torch.bool)
    for s in accepted_answers(item, template):
        for seq in tokenisations(s, tokenizer):
            if seq[:len(context)] == context and len(seq) > len(context):
                correct[seq[len(context)]] = True
    space = torch.tensor([_is_space(tokenizer, i) for i in range(z.shape[0])])
    correct &= ~space
    p = torch.softmax(z.double(), 0)
    return {"logits": z.double().numpy(), "correct": correct.numpy(), "context": context,
            "ambiguous_mass": float(p[space].sum()), "q_pos_first": float(p[correct].sum())}


@torch.no_grad()
def special_token_mass(model: torch.nn.Module, tokenizer, cands: AnswerCandidates, *, temperature: float) -> float:
    """The largest probability, over the prompts' first response position, of a special token other than EOS
    (the decoder drops it, so one sampled inside an answer would still read as the answer; Q_pos leaves it out)."""
    eos_ids, _ = special_ids(tokenizer)
    others = sorted(set(getattr(tokenizer, "all_special_ids", []) or []) - set(eos_ids))
    if not others:
        return 0.0
    b = cands.batch
    ids, mask = left_pad(b.prompt_ids, b.pad_id)  # [P, L]
    device = next(model.parameters()).device
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    z = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device)).logits[:, -1]
    p = torch.softmax(z.float() / temperature, -1)  # [P, V]
    return float(p[:, others].sum(-1).max())


def coverage(batch: RolloutBatch, cands: AnswerCandidates) -> float:
    """Share of a scored sample batch's correct responses whose token sequence is one of the candidates (the rest
    are accepted forms Q_pos does not enumerate). Rows are matched by their tokens up to and including EOS."""
    if batch.correct is None:
        raise ValueError("batch.correct: missing; score the batch first")
    sets = []
    c = cands.batch
    for p in range(c.num_prompts):
        rows = range(p * c.n, (p + 1) * c.n)
        sets.append({tuple(c.response_ids[r, :c.lengths[r]].tolist()) for r in rows})
    hit = tot = 0
    for r in torch.nonzero(batch.correct).flatten().tolist():
        tot += 1
        hit += tuple(batch.response_ids[r, :batch.lengths[r]].tolist()) in sets[r // batch.n]
    return hit / tot if tot else 1.0
