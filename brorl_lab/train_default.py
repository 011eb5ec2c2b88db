"""Train the shipped default model from scratch: a tiny Qwen2 warm-started by supervised learning on the families.

    python -m brorl_lab.train_default                       # -> data/default_model (tokenizer + model + TRAINING.md)
    python -m brorl_lab.train_default --steps 300 --out /tmp/m --eval-samples 4

Tokenizer: byte-level BPE (so any text encodes) whose merges are built explicitly, not learned: every frequent
letter-word pre-token of the families' prompts ("Ġthe", "ĠGreatest", "Answer", ...) gets the merge chain that makes
it one token, while digits always stay single tokens (Qwen2's pre-tokenizer isolates each digit), so numbers are
spelled digit by digit and prompts stay short (~20-30 tokens).

Supervised warm-start: each example is ``prompt_ids + answer_ids + [eos]`` with the prompt from the "plain"
template and the answer ``" " + reference``; the loss is the mean cross-entropy over answer tokens only,

    L = -(1 / |A|) sum_{t in A} log pi(x_t | x_<t),     A = the answer and EOS positions,

on fresh (never repeated) training items in a fixed order, with AdamW, linear warmup and cosine decay. Everything is
seeded (``torch.manual_seed``, item seeds), so the same command gives the same weights on the same software.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import torch

from .models import DEFAULT_MODEL_DIR
from .tasks import TASKS, TaskItem, sample_items

DEFAULT_FAMILIES = ("chain_sum", "gcd", "products", "simple_equations")
EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"
# Qwen2's pre-tokenizer: single digits, words with one leading non-letter (e.g. a space), punctuation runs.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=4)
MAX_POSITIONS = 256


# ---- tokenizer ------------------------------------------------------------------------------------------------
def build_tokenizer(corpus: Sequence[str], min_count: int = 10):
    """A byte-level BPE ``PreTrainedTokenizerFast``: 256 byte tokens, two specials, and one merge chain per frequent
    digit-free pre-token of ``corpus`` (so each becomes a single token). Deterministic in ``corpus``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
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
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
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
        losses.append(float(loss))
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

    from .rewards import score_response
    from .tasks import eval_set

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


# ---- command line ---------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--sequences-per-step", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=MODEL_SHAPE["hidden_size"])
    ap.add_argument("--layers", type=int, default=MODEL_SHAPE["num_hidden_layers"])
    ap.add_argument("--eval-prompts", type=int, default=200, help="eval prompts per family for the report (0: skip)")
    ap.add_argument("--eval-samples", type=int, default=8, help="samples per eval prompt at each temperature")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave the default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.time()
    count = args.steps * args.sequences_per_step
    items = sample_items(args.families, count, seed=args.seed, split="train")
    tokenizer = build_tokenizer([p + a for p, a in map(prompt_and_answer, items[:4000])])
    examples = encode(items, tokenizer)
    shape = dict(hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                 intermediate_size=3 * args.hidden_size)
    model = build_model(tokenizer, args.seed, **shape)
    t_data = time.time() - t0
    losses = train(model, examples, steps=args.steps, sequences_per_step=args.sequences_per_step, lr=args.lr)
    t_train = time.time() - t0 - t_data

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    argv = sys.argv[1:] if argv is None else list(argv)
    report = {"command": " ".join(["python -m brorl_lab.train_default", *argv]),
              "args": vars(args), "params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
              "prompt_tokens_mean": sum(len(p) for p, _ in examples[:2000]) / min(2000, len(examples)),
              "answer_tokens_max": max(len(a) for _, a in examples), "final_loss": sum(losses[-20:]) / 20,
              "seconds_data": round(t_data, 1), "seconds_train": round(t_train, 1), "pass_at_1": {}}
    if args.eval_prompts:
        for label, temp in (("greedy", None), ("t0.6", 0.6), ("t1.0", 1.0)):
            report["pass_at_1"][label] = measure_pass_at_1(model, tokenizer, args.families, prompts=args.eval_prompts,
                                                           samples=args.eval_samples, temperature=temp, seed=args.seed)
    (out / "training_report.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
