"""Train the shipped default model from scratch: a tiny Qwen2 warm-started by supervised learning on the families.

    python -m brorl_lab train-default                       # -> data/default_model (tokenizer + model + TRAINING.md)
    python -m brorl_lab train-default --steps 300 --out runs/m --eval-samples 4

Tokenizer: Qwen2's byte-level BPE (so any text encodes) with merges built explicitly, not learned: every frequent
word-like pre-token of the families' prompts ("Ġthe", "ĠGreatest", "Answer", ...) gets the merge chain that makes it
one token, while digits stay single tokens (Qwen2's pre-tokenizer isolates each digit), so numbers are spelled digit
by digit and prompts stay short (~15-25 tokens).

Supervised warm-start: each example is ``prompt_ids + answer_ids + [eos]`` with the prompt from the "plain"
template and the answer ``" " + reference``; the loss is the mean cross-entropy over answer tokens only,

    L = -(1 / |A|) sum_{t in A} log pi(x_t | x_<t),     A = the answer and EOS positions,

on fresh (never repeated) training items in a fixed order, with AdamW, linear warmup and cosine decay. Everything is
seeded (``torch.manual_seed``, item seeds), so the same command gives the same weights on the same software.
"""

from __future__ import annotations

import json
import math
import time
import types
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from brorl_lab.core.models import DEFAULT_MODEL_DIR
from brorl_lab.rollout.tasks import BUILTIN_FAMILIES, TASKS, TaskItem, sample_items

EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4)
MAX_POSITIONS = 256


# ---- tokenizer ------------------------------------------------------------------------------------------------
def build_tokenizer(corpus: Sequence[str], min_count: int = 10):
    """A ``Qwen2Tokenizer`` (byte-level BPE) with two specials, the 256 byte tokens, and one merge chain per
    digit-free pre-token seen at least ``min_count`` times in ``corpus``; deterministic in ``corpus``.

    It is built with transformers' own Qwen2 tokenizer class because ``AutoTokenizer`` (and so vLLM) rebuilds any
    ``qwen2`` model's tokenizer with that class (Qwen2's pre-tokenizer and NFC normaliser around the saved vocab and
    merges): building it the same way makes the tokenizer we train with identical to the one everyone loads.
    """
    from tokenizers import Regex, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    counts = Counter(p for text in corpus for p, _ in pre.pre_tokenize_str(text))
    words = sorted(w for w, c in counts.items() if c >= min_count and len(w) > 1 and not any(ch.isdigit() for ch in w))
    vocab = {EOS_TOKEN: 0, PAD_TOKEN: 1}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = []
    for w in words:  # merge chain w[:1]+w[1] -> w[:2], w[:2]+w[2] -> w[:3], ...
        for i in range(2, len(w) + 1):
            if w[:i] not in vocab:
                vocab[w[:i]] = len(vocab)
                merges.append((w[: i - 1], w[i - 1]))
    return Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=EOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                          model_max_length=MAX_POSITIONS, padding_side="left", clean_up_tokenization_spaces=False)


def build_model(tokenizer, seed: int, **shape):
    """A freshly initialised float32 ``Qwen2ForCausalLM`` with tied embeddings (both transformers and vLLM load it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0, use_sliding_window=False,
                      **{**MODEL_SHAPE, **shape})
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).float()


# ---- data -----------------------------------------------------------------------------------------------------
def prompt_and_answer(item: TaskItem) -> tuple[str, str]:
    """The plain prompt and the target continuation (``" " + answer``; EOS is appended as a token)."""
    return TASKS[item.family].format_prompt(item, "plain"), " " + item.answer


def tokenizer_corpus(families: Sequence[str], seed: int, count: int = 8000) -> list[str]:
    """The texts the tokenizer's merges are counted on: prompts and answers of ``count`` training items."""
    return [text for it in sample_items(families, count, seed=seed) for text in prompt_and_answer(it)]


def encode(items: Sequence[TaskItem], tokenizer) -> list[tuple[list[int], list[int]]]:
    """[(prompt_ids, answer_ids + [eos])] per item; prompt and answer tokenised separately, as in RL rollouts."""
    pairs = [prompt_and_answer(it) for it in items]
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    answers = tokenizer([a for _, a in pairs], add_special_tokens=False)["input_ids"]
    return [(p, a + [tokenizer.eos_token_id]) for p, a in zip(prompts, answers)]


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded ``input_ids`` [B, T], ``attention_mask`` [B, T] and ``labels`` [B, T] (-100 off the answer)."""
    width = max(len(p) + len(a) for p, a in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full_like(ids, -100)  # [B, T]
    mask = torch.zeros_like(ids)  # [B, T]
    for i, (p, a) in enumerate(examples):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        mask[i, : len(p) + len(a)] = 1
    return ids, mask, labels


# ---- training -------------------------------------------------------------------------------------------------
def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to lr/10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, examples, *, steps: int, sequences_per_step: int, lr: float, warmup: int = 50,
          pad_id: int = 1, progress: bool = True) -> list[float]:
    """Supervised warm-start on ``examples`` in order (``sequences_per_step`` per step); returns the loss per step."""
    from tqdm.auto import tqdm

    if len(examples) < steps * sequences_per_step:
        raise ValueError(f"examples: got {len(examples)}; need steps * sequences_per_step = "
                         f"{steps * sequences_per_step}")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    losses = []
    bar = tqdm(range(steps), desc="train_default", disable=not progress)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        ids, mask, labels = collate(examples[step * sequences_per_step : (step + 1) * sequences_per_step], pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss  # mean CE over answer tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


# ---- measurement ----------------------------------------------------------------------------------------------
@torch.no_grad()
def measure_pass_at_1(model, tokenizer, families: Sequence[str], *, prompts: int, samples: int,
                      temperature: Optional[float], seed: int = 0, max_new_tokens: int = 10,
                      progress: bool = True) -> dict[str, float]:
    """pass@1 per family on its frozen eval set: the mean of ``correct`` over ``prompts`` x ``samples`` responses
    (HF ``generate``; ``temperature=None`` is greedy, one sample)."""
    from tqdm.auto import tqdm

    from brorl_lab.rollout.rewards import score_response
    from brorl_lab.rollout.tasks import eval_set

    model.eval()
    out = {}
    for fam in tqdm(families, desc="pass@1", disable=not progress):
        items = eval_set(fam, limit=prompts)
        enc = tokenizer([TASKS[fam].format_prompt(it, "plain") for it in items], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        greedy = temperature is None
        n = 1 if greedy else samples
        torch.manual_seed(seed)
        gen = model.generate(**enc, do_sample=not greedy, temperature=None if greedy else temperature, top_p=None,
                             top_k=None, num_return_sequences=n, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)  # [P*n]
        out[fam] = sum(score_response(t, items[b // n]).correct for b, t in enumerate(texts)) / len(texts)
    return out


def training_card(report: dict) -> str:
    """TRAINING.md for the model directory: how it was made and what it scores."""
    a = report["args"]
    lines = [f"# A supervised warm start ({a['out']})" if Path(a["out"]).name != "default_model"
             else "# The default model (data/default_model)", "",
             f"A {report['params'] / 1e6:.2f}M-parameter Qwen2ForCausalLM (float32, hidden {a['hidden_size']}, "
             f"{a['layers']} layers, vocab {report['vocab']}) trained from scratch by `brorl_lab.rl.train_default`: "
             "supervised warm-start on the families' train split, loss on the answer tokens only.", "",
             f"    {report['command']}", "",
             f"- seed {a['seed']}, {a['steps']} steps x {a['sequences_per_step']} sequences "
             f"({a['steps'] * a['sequences_per_step']} fresh training items, never repeated), AdamW lr {a['lr']} "
             "with warmup and cosine decay",
             f"- families: {', '.join(a['families'])} (mixed uniformly)",
             f"- prompts {report['prompt_tokens_mean']:.1f} tokens on average (plain template), answers at most "
             f"{report['answer_tokens_max']} tokens including EOS",
             f"- data {report['seconds_data']} s, training {report['seconds_train']} s wall / "
             f"{report.get('cpu_seconds_train', '?')} s CPU (torch threads: {a['threads'] or 'default'}; "
             "the machine's 2 cores were shared with other work)", ""]
    if report["pass_at_1"]:
        cols = list(report["pass_at_1"])
        lines += [f"pass@1 on the frozen eval sets (first {a['eval_prompts']} prompts of data/eval/<family>.jsonl; "
                  f"{a['eval_samples']} samples per prompt at each temperature, 1 for greedy; top_p 1):", "",
                  "| family | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for fam in a["families"]:
            lines.append(f"| {fam} | " + " | ".join(f"{report['pass_at_1'][c][fam]:.3f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


# ---- command line ---------------------------------------------------------------------------------------------
TRAIN_DEFAULTS = dict(steps=1300, sequences_per_step=64, lr=2e-3, seed=0, hidden_size=MODEL_SHAPE["hidden_size"],
                      layers=MODEL_SHAPE["num_hidden_layers"], eval_prompts=200, eval_samples=8, threads=0)


def train_default_model(out: str | Path = DEFAULT_MODEL_DIR, families: Sequence[str] = BUILTIN_FAMILIES, *,
                        command: str = "python -m brorl_lab train-default", **options) -> dict:
    """Build the tokenizer, train the model (``options``: the keys of ``TRAIN_DEFAULTS``), save it with its
    ``training_report.json`` and ``TRAINING.md`` into ``out``; returns the report."""
    unknown = sorted(set(options) - set(TRAIN_DEFAULTS))
    if unknown:
        raise ValueError(f"options: got {unknown}; allowed: {', '.join(TRAIN_DEFAULTS)}")
    args = types.SimpleNamespace(out=str(out), families=list(families), **{**TRAIN_DEFAULTS, **options})
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.time()
    count = args.steps * args.sequences_per_step
    items = sample_items(args.families, count, seed=args.seed, split="train")
    tokenizer = build_tokenizer(tokenizer_corpus(args.families, args.seed))
    examples = encode(items, tokenizer)
    shape = dict(hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                 intermediate_size=3 * args.hidden_size)
    model = build_model(tokenizer, args.seed, **shape)
    t_data = time.time() - t0
    cpu0 = time.process_time()
    losses = train(model, examples, steps=args.steps, sequences_per_step=args.sequences_per_step, lr=args.lr)
    t_train, cpu_train = time.time() - t0 - t_data, time.process_time() - cpu0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report = {"command": command,
              "args": vars(args), "params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
              "prompt_tokens_mean": sum(len(p) for p, _ in examples[:2000]) / min(2000, len(examples)),
              "answer_tokens_max": max(len(a) for _, a in examples), "final_loss": sum(losses[-20:]) / 20,
              "seconds_data": round(t_data, 1), "seconds_train": round(t_train, 1),
              "cpu_seconds_train": round(cpu_train, 1), "pass_at_1": {}}
    if args.eval_prompts:
        for label, temp in (("greedy", None), ("t0.6", 0.6), ("t1.0", 1.0)):
            report["pass_at_1"][label] = measure_pass_at_1(model, tokenizer, args.families, prompts=args.eval_prompts,
                                                           samples=args.eval_samples, temperature=temp, seed=args.seed)
    (out / "training_report.json").write_text(json.dumps(report, indent=1))
    (out / "TRAINING.md").write_text(training_card(report))
    return report

