"""``TorchEngine``: our own batched sampler on a HF causal LM, with each prompt's prefix computed once for N samples.

For a chunk of prompts (at most ``chunk_sequences`` sampled sequences), the work is::

    prefill   the chunk's P_c distinct prompts once, left-padded (the HF forward):   prefix KV [P_c, H_kv, L, d]
    decode    y_t ~ top_p(softmax(z_t / tau)) for all P_c*K rows at once;  logp_t = log softmax(z_t / tau)[y_t]
              rows that emitted EOS are masked, and compacted away once enough have finished

so a prompt's prefix costs one forward pass instead of N (transformers ``generate`` with
``num_return_sequences=N`` runs the prompt N times and then attends over N copies of its KV).

Two decode kernels:

- ``"shared_prefix"`` (Llama-family models: Llama, Qwen2, Qwen3, Mistral without sliding window): our own decode
  step over the model's own modules. The prefix KV is stored once per prompt, never copied per sample; generated
  KV lives in preallocated [rows, H_kv, T, d] buffers; attention joins the two
  (:mod:`brorl_lab.core.prefix_attention`, shared with the trainer's log-probs).
- ``"hf_cache"`` (any HF causal LM): the model's forward with a ``DynamicCache`` whose prefix rows are gathered to
  the N samples; the generic fallback.

On CUDA the shared-prefix decode step can be replayed from CUDA graphs (``decode_graphs="cuda"``; opt-in until
a GPU run of bench/gpu_check.sh has measured it): a 1.5B model's decode step is some thirty small kernels per layer,
and on an H200 most of its time went to launching them (that script's profile: 79% of decode time with no kernel
running). A graph needs fixed shapes, so a step attends over a fixed-width window of the generated-KV buffers
(widths in multiples of ``GRAPH_WIDTH`` columns, the columns not yet written masked to -inf) and writes its new
column at an index held in a device tensor; one graph is captured per window and replayed for each of its steps.
"""

from __future__ import annotations

import warnings

import torch

from brorl_lab.core.batch import left_pad
from brorl_lab.core.prefix_attention import (
    SHARED_PREFIX_MODEL_TYPES,
    PrefixDecoder,
    PrefixGrid,
    padding_bias,
    supports_shared_prefix,
)
from brorl_lab.rollout.engines.base import RolloutSampling
from brorl_lab.rollout.engines.common import ModuleEngine, make_generator, sample_next

KERNELS = ("auto", "shared_prefix", "hf_cache")
DECODE_GRAPHS = ("off", "cuda", "static")
GRAPH_WIDTH = 64  # generated-KV columns per graph: attention reads at most this many masked columns in vain


def _decode_step(decoder: PrefixDecoder, tok: torch.Tensor, pos: torch.Tensor, t: int, col: torch.Tensor,
                 prefix: list, bias: torch.Tensor, gen: list, P: int) -> torch.Tensor:
    """One shared-prefix decode step: logits [R, V] after feeding token ``tok`` [R] at positions ``pos`` [R] as
    generated token ``t`` (``col`` = [t], long), its key/value written to column t of the generated-KV buffers
    ``gen`` (per layer [R, H_kv, T, d]) before attention reads columns 0..t. A plain function of its inputs, so
    ``torch.compile`` can fuse it (:data:`_FUSED_STEP`)."""
    def append(i, k, v):  # k, v [R, H_kv, 1, d] -> the row's generated keys/values 0..t
        gk, gv = gen[i]
        gk.index_copy_(2, col, k)
        gv.index_copy_(2, col, v)
        return gk[:, :, : t + 1], gv[:, :, : t + 1]

    grid = PrefixGrid(P, len(tok) // P)  # rows are [P, K] in order
    return decoder.logits(tok[:, None], pos[:, None], prefix, bias, grid, own_kv=append)[:, 0]


_FUSED_STEP = None  # torch.compile(_decode_step), built on first use (compiled graphs are shared by all engines)
# Steps t < FUSED_FROM run eagerly: torch.compile specialises the sizes 0 and 1 (own-KV widths t + 1 = 1, 2), which
# would cost two more compiles of the step for two tokens' worth of work.
FUSED_FROM = 2


def _fused_step():
    global _FUSED_STEP
    if _FUSED_STEP is None:
        # dynamic=True: rows R, prompts P and the step t are symbols, so one compile serves every step and every
        # compaction (sizes 0 and 1 are still specialised by torch.compile: P = 1 is its own graph)
        _FUSED_STEP = torch.compile(_decode_step, dynamic=True)
    return _FUSED_STEP


class _SharedPrefixDecoder:
    """The decode step of :class:`~brorl_lab.core.prefix_attention.PrefixDecoder`: the prefill's KV is the shared prefix,
    generated KV goes into preallocated [rows, H_kv, T, d] buffers (column t is written before it is read).
    ``fused``: run steps t >= :data:`FUSED_FROM` through ``torch.compile`` (inductor), which fuses each step's norms,
    RoPE, SwiGLU, residual adds and attention softmax and drops the per-op Python dispatch."""

    def __init__(self, decoder: PrefixDecoder, fused: bool = False):
        self.decoder = decoder
        self.fused = fused

    def start(self, cache, prefix_mask: torch.Tensor, P: int, rows: int, T: int) -> None:
        """Take the prefill's KV (post-RoPE keys, float32) as the shared prefix and allocate the generated-KV
        buffers for ``rows`` = P*K rows in the [P, K] layout."""
        self.prefix = [(layer.keys.float(), layer.values.float()) for layer in cache.layers]  # [P_c, H_kv, L, d]
        self.bias = padding_bias(prefix_mask)  # [P_c, L]
        k0 = self.prefix[0][0]
        shape = (rows, k0.shape[1], T, k0.shape[3])  # [R, H_kv, T, d]
        self.gen = [(k0.new_empty(shape), k0.new_empty(shape)) for _ in self.prefix]
        self.P = P

    def compact(self, index: torch.Tensor) -> None:
        """Keep generated-KV rows ``index`` (the prefix is per prompt and never moves)."""
        self.gen = [(k[index], v[index]) for k, v in self.gen]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        """Logits [R, V] after feeding token ``tok`` [R] at positions ``pos`` [R] as generated token ``t``."""
        fn = _fused_step() if self.fused and t >= FUSED_FROM else _decode_step
        col = torch.full((1,), t, dtype=torch.long, device=tok.device)
        return fn(self.decoder, tok, pos, t, col, self.prefix, self.bias, self.gen, self.P)


class _StaticShapeDecoder(_SharedPrefixDecoder):
    """The same decode step with shapes fixed within each window of ``GRAPH_WIDTH`` generated tokens, so that on
    CUDA it can be captured once as a CUDA graph and replayed (``capture=True``); with ``capture=False`` it runs
    eagerly, which is how the tests check it equals the dynamic step on the CPU.

    Inputs live in static buffers (tokens, positions, and the column index ``t`` as a device tensor); a step over
    window width w writes its key/value at column t (``index_copy_``) and attends over columns 0..w-1 with the
    columns after t masked (``own_bias``). Compaction changes the row count, which drops the captured graph.
    """

    def __init__(self, decoder: PrefixDecoder, capture: bool):
        super().__init__(decoder)
        self.capture = capture

    def start(self, cache, prefix_mask: torch.Tensor, P: int, rows: int, T: int) -> None:
        super().start(cache, prefix_mask, P, rows, T)
        for k, v in self.gen:  # masked columns are still read: NaN or inf garbage would survive -inf (0 * inf)
            k.zero_(), v.zero_()
        self.T = T
        self._inputs(rows)

    def _inputs(self, rows: int) -> None:
        dev = self.bias.device
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)  # [R]
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # [R]
        self.t = torch.zeros(1, dtype=torch.long, device=dev)  # the column this step writes
        self.graph = None  # (width, CUDA graph, its logits output [R, V]): the current window's

    def compact(self, index: torch.Tensor) -> None:
        super().compact(index)
        self._inputs(len(index))

    def _step(self, width: int) -> torch.Tensor:
        """The fixed-shape step: logits [R, V] from the static inputs, over generated columns 0..width-1."""
        def append(i, k, v):  # k, v [R, H_kv, 1, d] -> columns 0..width-1 of the row's buffers, column t written
            gk, gv = self.gen[i]
            gk.index_copy_(2, self.t, k)
            gv.index_copy_(2, self.t, v)
            return gk[:, :, :width], gv[:, :, :width]

        cols = torch.arange(width, device=self.t.device)
        own_bias = torch.zeros(width, device=self.t.device).masked_fill(cols > self.t, float("-inf"))  # [width]
        grid = PrefixGrid(self.P, len(self.tok) // self.P)
        return self.decoder.logits(self.tok[:, None], self.pos[:, None], self.prefix, self.bias, grid,
                                   own_kv=append, own_bias=own_bias)[:, 0]

    def step(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        self.t.fill_(t)
        width = min(self.T, GRAPH_WIDTH * (t // GRAPH_WIDTH + 1))
        if not self.capture:
            return self._step(width)
        if self.graph is None or self.graph[0] != width:
            self.graph = None  # windows only grow: the last one's graph (and its memory pool) is done with
            try:
                self.graph = (width, *self._capture(width))
            except RuntimeError as e:  # a model whose step cannot be captured: the same step, launched eagerly
                warnings.warn(f"TorchEngine: CUDA-graph capture failed ({str(e).splitlines()[0]}); decoding "
                              "without graphs (decode_graphs='off' skips the attempt)", RuntimeWarning, stacklevel=2)
                self.capture = False
                return self._step(width)
        _, graph, logits = self.graph
        graph.replay()
        return logits

    def _capture(self, width: int):
        """Capture the step at ``width`` as a CUDA graph. The warm-up runs (on a side stream, as CUDA graphs need)
        compute this very step from the inputs already in place, so what they write is what the replay writes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(width)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self._step(width)
        return graph, logits


def _check_decode_options(device_type: str, kernel: str, decode_graphs: str, compile_decode: bool) -> None:
    """The decode-step options against the kernel and device: one line naming the field and what is allowed."""
    if decode_graphs == "cuda" and device_type != "cuda":
        raise ValueError(f"decode_graphs: 'cuda' needs a CUDA device, this engine is on {device_type}; "
                         "allowed: off, static")
    if decode_graphs != "off" and kernel != "shared_prefix":
        raise ValueError(f"decode_graphs: {decode_graphs!r} needs kernel='shared_prefix' (this engine's is "
                         f"{kernel!r}); allowed: off")
    if compile_decode and (kernel != "shared_prefix" or decode_graphs != "off"):
        raise ValueError(f"compile_decode: True needs kernel='shared_prefix' and decode_graphs='off' (this "
                         f"engine's: {kernel!r}, {decode_graphs!r}); allowed: False")
    if compile_decode and device_type == "cpu":
        _check_cpp_compiler()


def _check_cpp_compiler() -> None:
    """torch.compile's CPU backend (inductor) builds C++: fail at construction, in one line, if it has no compiler."""
    from torch._inductor import config
    from torch._inductor.cpp_builder import cpp_compiler_search

    try:
        cpp_compiler_search(tuple(config.cpp.cxx) if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,))
    except Exception as e:  # inductor raises its own "no working C++ compiler" error
        raise ValueError(f"compile_decode: True needs a C++ compiler for torch.compile on the CPU ({str(e).splitlines()[0]}); "
                         "allowed: False, or install g++ (or set CXX)") from e


class TorchEngine(ModuleEngine):
    """Batched KV-cache sampler.

    ``TorchEngine(model, tokenizer=None, *, device="auto", dtype="auto", chunk_sequences=1024, kernel="auto")``.
    ``model``: ``'default'``, a local HF directory, a hub id or a HF causal-LM ``nn.Module`` (copied: the engine
    keeps its own eval-mode weights, and :meth:`sync_weights` copies the trainer's in). ``kernel``: ``"auto"``
    picks ``"shared_prefix"`` when the architecture allows it, else ``"hf_cache"``. ``drop_finished_fraction``:
    finished rows are compacted away once they are at least this share of the rows still decoded (compaction
    copies the generated KV, so doing it for every finished row would cost more than it saves). ``decode_graphs``
    (shared-prefix kernel): ``"off"`` launches every kernel of a decode step from Python, ``"cuda"`` replays the
    step from CUDA graphs (CUDA devices only), ``"static"`` runs the graphs' fixed-shape step without capture on any
    device (what the tests compare with ``"off"``). ``compile_decode`` (shared-prefix kernel, ``decode_graphs="off"``):
    run the decode step through ``torch.compile`` (inductor; on the CPU it needs a C++ compiler), which fuses each
    step's norms, RoPE, SwiGLU, residual adds and attention softmax into a few kernels and drops the per-op Python
    dispatch. Same tokens, log-probs within ~1e-6 (tests/test_fused_step.py); it costs a one-time compile per process
    (tens of seconds on a 2-core CPU; inductor caches it on disk for the next process), so it pays on long
    responses only: see docs/benchmarks.md for the interleaved measurement that sets the default.
    """

    name = "torch"

    def __init__(self, model="default", tokenizer=None, *, device: str = "auto", dtype: str = "auto",
                 chunk_sequences: int = 1024, kernel: str = "auto", drop_finished_fraction: float = 0.25,
                 decode_graphs: str = "off", compile_decode: bool = False):
        if kernel not in KERNELS:
            raise ValueError(f"kernel: got {kernel!r}; allowed: {', '.join(KERNELS)}")
        if decode_graphs not in DECODE_GRAPHS:
            raise ValueError(f"decode_graphs: got {decode_graphs!r}; allowed: {', '.join(DECODE_GRAPHS)}")
        if not isinstance(compile_decode, bool):
            raise ValueError(f"compile_decode: got {compile_decode!r}; allowed: True or False")
        if not (isinstance(drop_finished_fraction, (int, float)) and 0 < drop_finished_fraction <= 1):
            raise ValueError(f"drop_finished_fraction: got {drop_finished_fraction!r}; allowed: a float in (0, 1]")
        super().__init__(model, tokenizer, device=device, dtype=dtype, chunk_sequences=chunk_sequences)
        if kernel == "auto":
            kernel = "shared_prefix" if supports_shared_prefix(self.model) else "hf_cache"
        elif kernel == "shared_prefix" and not supports_shared_prefix(self.model):
            raise ValueError(f"kernel: 'shared_prefix' does not support model_type {self.model.config.model_type!r} "
                             f"(allowed: {', '.join(SHARED_PREFIX_MODEL_TYPES)} with full attention); use 'hf_cache'")
        self.kernel = kernel
        self.drop_finished_fraction = float(drop_finished_fraction)
        _check_decode_options(self.device.type, kernel, decode_graphs, compile_decode)
        self.decode_graphs = decode_graphs
        self.compile_decode = compile_decode
        # one decoder for the engine's life (its model is updated in place by sync_weights), so a compiled step's
        # guards on it hold from chunk to chunk
        self._prefix_decoder = PrefixDecoder(self.model) if kernel == "shared_prefix" else None

    def _sample_chunks(self, chunks, sampling):
        gen = make_generator(sampling.seed, self.device)
        return [self._generate_chunk(seqs, k, sampling, gen) for seqs, k in chunks]

    def _extra_meta(self) -> dict:
        return {"kernel": self.kernel, "decode_graphs": self.decode_graphs, "compile_decode": self.compile_decode}

    # ---- the sampler --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _generate_chunk(self, seqs: list[list[int]], k: int, sampling: RolloutSampling,
                        gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` samples of each prompt in ``seqs``; returns ``(ids, logprobs)`` [P_c*k, max_new_tokens] on CPU,
        rows prompt-major, EOS-finished rows padded (ids -> pad, logprobs -> 0)."""
        from transformers import DynamicCache

        model, dev, T, pad = self.model, self.device, sampling.max_new_tokens, self.pad_id
        ids, mask = left_pad(seqs, pad)  # [P_c, L]
        padded = bool((mask == 0).any())
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [P_c, L] positions restart at each prompt's first real token
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, attention_mask=mask if padded else None, position_ids=pos,
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [P_c, V]
        P, R = len(seqs), len(seqs) * k
        row_prompt = torch.arange(P, device=dev).repeat_interleave(k)  # [R]
        logits, next_pos = logits[row_prompt], pos[row_prompt, -1] + 1  # [R, V], [R]
        if self.kernel == "shared_prefix":
            if self.decode_graphs == "off":
                decoder = _SharedPrefixDecoder(self._prefix_decoder, fused=self.compile_decode)
            else:
                decoder = _StaticShapeDecoder(self._prefix_decoder, capture=self.decode_graphs == "cuda")
            decoder.start(cache, mask, P, R, T)
        else:
            cache.batch_select_indices(row_prompt)  # every sample row gets a copy of its prompt's prefix KV
            mask = mask[row_prompt] if padded else None  # [R, L]

        out_ids = torch.full((R, T), pad, dtype=torch.long, device=dev)  # [R, T]
        out_lp = torch.zeros((R, T), dtype=torch.float32, device=dev)  # [R, T]
        rows = torch.arange(R, device=dev)  # [A] output row of each decoded row (A = P_c*K in the shared layout)
        alive = torch.ones(R, dtype=torch.bool, device=dev)  # [A] not yet finished
        eos = torch.tensor(self.eos_ids, device=dev)
        K = k  # rows per prompt in the shared-prefix layout
        for t in range(T):
            tok, lp = sample_next(logits, sampling.temperature, sampling.top_p, gen)  # [A], [A]
            out_ids[rows, t] = torch.where(alive, tok, pad)
            out_lp[rows, t] = torch.where(alive, lp, 0.0)
            if not sampling.ignore_eos:
                alive &= ~torch.isin(tok, eos)
            if t == T - 1 or not bool(alive.any()):
                break
            if self.kernel == "shared_prefix":
                # Compact each prompt's live rows to the front of a narrower [P_c, K'] layout.
                K_new = int(alive.view(P, K).sum(1).max())
                if (K - K_new) * P >= self.drop_finished_fraction * P * K:
                    order = (~alive.view(P, K)).to(torch.int8).argsort(dim=1, stable=True)[:, :K_new]
                    keep = (order + torch.arange(P, device=dev)[:, None] * K).reshape(-1)  # [P_c*K']
                    decoder.compact(keep)
                    rows, alive, tok, next_pos, K = rows[keep], alive[keep], tok[keep], next_pos[keep], K_new
                logits = decoder.step(tok, next_pos, t)
            else:
                if (~alive).sum() >= self.drop_finished_fraction * len(alive):
                    keep = alive.nonzero().squeeze(1)  # [A']
                    cache.batch_select_indices(keep)
                    rows, alive, tok, next_pos = rows[keep], alive[keep], tok[keep], next_pos[keep]
                    mask = None if mask is None else mask[keep]
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)  # [A, L + t + 1]
                logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                               past_key_values=cache, use_cache=True).logits[:, -1]  # [A, V]
            next_pos = next_pos + 1
        return out_ids.cpu(), out_lp.cpu()
