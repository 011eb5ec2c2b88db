"""``HFEngine``: rollouts with transformers ``generate`` — the reference implementation and the fallback.

    generate(do_sample=True, num_return_sequences=N, temperature=tau, top_p, top_k=0, max_new_tokens,
             output_logits=True)

``output_logits`` returns the raw logits z_t (before the temperature and top-p processors), so the log-prob of
each sampled token is ``log softmax(z_t / tau)[y_t]``, the contract every engine follows. The prompt is repeated N
times inside ``generate`` (no prefix sharing): that is the cost :class:`~brorl_lab.rollout.engines.torch_engine.TorchEngine`
avoids.
"""

from __future__ import annotations

import torch

from brorl_lab.core.batch import left_pad
from brorl_lab.rollout.engines.base import RolloutSampling
from brorl_lab.rollout.engines.common import ModuleEngine


class HFEngine(ModuleEngine):
    """``HFEngine(model, tokenizer=None, *, device="auto", dtype="auto", chunk_sequences=1024)``.

    ``model``: ``'default'``, a local HF directory, a hub id or a HF causal-LM ``nn.Module`` (copied; see
    :meth:`sync_weights`). The copy's generation config is reset to the library defaults so a hub model's own
    (repetition penalty, top-k, min-p, ...) never changes what is sampled.
    """

    name = "hf"

    def __init__(self, model="default", tokenizer=None, *, device: str = "auto", dtype: str = "auto",
                 chunk_sequences: int = 1024):
        from transformers import GenerationConfig

        super().__init__(model, tokenizer, device=device, dtype=dtype, chunk_sequences=chunk_sequences)
        self.model.generation_config = GenerationConfig()

    def _sample_chunks(self, chunks, sampling: RolloutSampling):
        # generate() draws from torch's global RNG: fork it so seeding here leaves the caller's stream alone.
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if sampling.seed is None:
                torch.seed()
            else:
                torch.manual_seed(int(sampling.seed))
            return [self._generate_chunk(seqs, k, sampling) for seqs, k in chunks]

    @torch.inference_mode()
    def _generate_chunk(self, seqs: list[list[int]], k: int, sampling: RolloutSampling):
        from transformers import GenerationConfig

        ids, mask = left_pad(seqs, self.pad_id)  # [P_c, L]
        eos = None if sampling.ignore_eos else self.eos_ids  # None: no stop token, every row runs to the end
        cfg = GenerationConfig(do_sample=True, num_return_sequences=k, temperature=sampling.temperature,
                               top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_new_tokens,
                               eos_token_id=eos, pad_token_id=self.pad_id, return_dict_in_generate=True,
                               output_logits=True)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=cfg)
        response = out.sequences[:, ids.shape[1]:]  # [P_c*k, T_c], rows prompt-major (repeat_interleave)
        logprobs = torch.stack([  # per step, so the [B, T, V] log-softmax is never materialised at once
            torch.log_softmax(z.float() / sampling.temperature, dim=-1).gather(-1, response[:, t, None])[:, 0]
            for t, z in enumerate(out.logits)], dim=1)  # [P_c*k, T_c]
        return response.cpu(), logprobs.cpu()
