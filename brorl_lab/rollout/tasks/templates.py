"""Prompt templates and answer extraction, shown to the user rather than hidden in a trainer.

Two templates:

- ``"plain"`` for the tiny default model: the question, a newline and a fixed answer cue. The model answers and
  emits EOS, e.g. ``"... 43 + 14 =\\nAnswer:"`` -> ``" 57<eos>"``.
- ``"chat"`` for real instruction-tuned models: the question plus an instruction to put the final answer in
  ``<answer></answer>`` tags (reasoning-gym, ProRL) or ``\\boxed{}`` (math), wrapped by the tokenizer's own chat
  template when it has one.

Extraction (:func:`extract_answer`) looks, in order, for the last ``<answer>...</answer>``, then the last
``\\boxed{...}``; with the plain template it falls back to the first non-empty line. It never raises; ``None``
means no answer was found, which every family scores 0.

    format_prompt("Calculate 2 + 3.", "plain")      # 'Calculate 2 + 3.\\nAnswer:'
    extract_answer(" 5", "plain")                   # '5'
    extract_answer("so <answer>5</answer>", "chat") # '5'
"""

from __future__ import annotations

import re
from typing import Any, Optional

TEMPLATES = ("plain", "chat")

# The tiny default model is trained on exactly this (brorl_lab.rl.train_default): prompt, then " <answer><eos>".
PLAIN_TEMPLATE = "{question}\nAnswer:"
# Chat instructions (the user turn); reasoning-gym answers go in tags, math answers in \boxed{}.
CHAT_ANSWER_TAGS = ("{question}\n\nThink briefly, then give only the final answer inside <answer></answer> tags, "
                    "for example <answer>42</answer>.")
CHAT_BOXED = "{question}\n\nThink briefly, then put only the final answer within \\boxed{{}}."
# Used when a tokenizer has no chat template of its own.
CHAT_FALLBACK = "User: {content}\nAssistant:"

# Bounds that keep extraction and verification cheap on pathological outputs (a huge string, a runaway sample):
# only the tail of a response is searched for tags / \boxed{}, and longer answers are rejected by the families.
MAX_RESPONSE_CHARS = 8192
MAX_ANSWER_CHARS = 128

_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def check_template(template: str) -> str:
    if template not in TEMPLATES:
        raise ValueError(f"template: got {template!r}; allowed: {', '.join(TEMPLATES)}")
    return template


def resolve_template(template: str, model: str, tokenizer: Any = None) -> str:
    """Config's ``template='auto'``: ``'chat'`` when the tokenizer has a chat template (real instruction-tuned
    models), else ``'plain'`` (the shipped default model and checkpoints trained from it). Without a tokenizer:
    ``'plain'`` for ``model='default'``, ``'chat'`` otherwise."""
    if template == "auto":
        if tokenizer is not None:
            return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
        return "plain" if model == "default" else "chat"
    return check_template(template)


def format_prompt(question: str, template: str = "plain", tokenizer: Any = None,
                  chat_instruction: str = CHAT_ANSWER_TAGS) -> str:
    """The exact prompt string for ``question``.

    ``chat`` uses ``tokenizer.apply_chat_template`` (one user turn, generation prompt added) when the tokenizer has
    a chat template, else :data:`CHAT_FALLBACK`.
    """
    check_template(template)
    if template == "plain":
        return PLAIN_TEMPLATE.format(question=question)
    content = chat_instruction.format(question=question)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
    return CHAT_FALLBACK.format(content=content)


def last_boxed(text: str) -> Optional[str]:
    r"""Content of the last ``\boxed{...}`` with balanced braces, or None (also for an unclosed one)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def extract_answer(response: Any, template: str = "plain") -> Optional[str]:
    """The model's final answer in ``response``, or None. Never raises (non-strings give None)."""
    if not isinstance(response, str) or template not in TEMPLATES:
        return None
    tail = response[-MAX_RESPONSE_CHARS:]
    tags = _ANSWER_TAG.findall(tail)
    if tags:
        return tags[-1]
    boxed = last_boxed(tail)
    if boxed is not None:
        return boxed
    if template == "plain":
        for line in response[: MAX_RESPONSE_CHARS].splitlines():
            if line.strip():
                return line.strip()
    return None
