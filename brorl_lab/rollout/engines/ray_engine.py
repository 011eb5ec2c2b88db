"""``RayEngine``: a pool of Ray actors, each running another rollout engine (torch, hf or vllm), behind the same
``generate / sync_weights / close`` interface. Ray is for machines you add (more GPUs, more nodes), not for speed on
one small machine.

    engine = RayEngine(policy, tok, workers=4, worker_engine="torch", address="auto", num_gpus_per_worker=1)
    batch  = engine.generate(prompts, n=512, sampling=RolloutSampling(seed=0))   # one prompt-major RolloutBatch
    engine.sync_weights(policy)                                                 # ray.put once, every actor loads
    engine.close()

**Work split** (:func:`plan_shards`). A call with P prompts and N samples each becomes at most W shards (W = workers),
shard i runs on worker i:

    P >= W:  contiguous prompt ranges of near-equal size (sizes differ by at most 1), each with all N samples
    P <  W:  prompt p gets w_p = W // P + (p < W % P) shards (at most N), its N samples cut into w_p contiguous ranges

Shards are ordered by (first prompt, first sample), so joining their rows in shard order is already prompt-major
(b = p*N + s): :func:`merge_shards` pads and concatenates them into ONE RolloutBatch.

**Per-prompt counts** (``n = [N_0, ..., N_{P-1}]``, a per-prompt allocation): the split balances *samples*, not
prompts. With ``target = ceil(sum_p N_p / W)`` rows per shard, a prompt with N_p > target is cut into
ceil(N_p / target) near-equal one-prompt shards, and runs of consecutive smaller prompts are packed whole into shards
of at most ``target`` rows; shard i runs on worker i mod W (a worker may get more than one shard, run in turn).

**Seeds** (:func:`shard_sampling`). The wrapped engines draw all rows of a call from one seeded generator, so a
row's sample depends on the whole call (which prompts share it, in which order). Rather than pretend otherwise, the
split is part of the semantics: a shard is an ordinary call of the wrapped engine on its prompts and sample count,
with seed

    seed_i = sampling.seed                                        if the call is one shard (W = 1, or P = N = 1)
    seed_i = sha256(sampling.seed, first prompt_i, first sample_i) otherwise (31 bits; None stays None)

so for a given ``(sampling.seed, P, N, W)`` the batch is fixed, a retried shard reproduces exactly what the lost
one would have returned, and :func:`generate_sharded` reproduces it in-process with any engine (the reference the
tests compare with). Bitwise equality needs the same hardware, library versions and torch thread count (float
reductions change with the thread count); across machines results agree in distribution only.

**Weights.** An ``nn.Module`` is shipped once through the object store as (class, config, CPU state dict in the
workers' dtype); a model name or directory is loaded by every actor itself (the path must exist on every node).
``sync_weights`` puts the new state dict in the object store once (``ray.put``) and every actor loads that one object;
the latest one is kept so a replacement actor starts from the current weights.

**Failures.** Every wait has a deadline (``ray.wait(..., timeout=)``), so nothing hangs: a worker that dies (crash,
OOM, node lost, ``ray.kill``) is replaced by a fresh actor and its shard rerun, up to ``max_retries`` times, then one
``RuntimeError`` names the worker and the cause; an error raised inside the wrapped engine is re-raised once, naming
the worker (as ``ValueError`` when it was one, e.g. a prompt the tokenizer cannot encode); a worker that does not
answer within ``timeout_s`` is killed (replaced at the next call) and reported. ``close()`` kills the actors and,
when this engine started Ray, shuts it down; it is idempotent.

**Cluster.** ``address=None``: join Ray if this process already initialised it, else start a local cluster
(``ray.init(address="local")``, ``local_cpus`` CPUs) owned by this engine. ``address="auto"`` or ``"host:6379"`` or
``"ray://host:10001"``: connect to a running cluster (``ray start --head`` on one node, ``ray start
--address=host:6379`` on the others); ``close()`` then only disconnects. Actors are spread over nodes
(``scheduling_strategy="SPREAD"``); each node needs brorl_lab and its dependencies installed (same environment).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from brorl_lab.core.batch import RolloutBatch
from brorl_lab.core.seeding import derive_seed
from brorl_lab.core.validation import check_int, is_int, is_number
from brorl_lab.rollout.engines.base import (
    RolloutEngine,
    RolloutSampling,
    check_generate_args,
    is_per_prompt,
    per_prompt_counts,
)

WORKER_ENGINES = ("torch", "hf", "vllm")


# ---- the split: pure functions, shared by the Ray pool and the in-process reference ----------------------------------
@dataclass(frozen=True)
class Shard:
    """One worker's part of a ``generate`` call: samples ``samples`` (a range of sample indices) of the prompts
    ``prompts`` (a range of prompt indices). Shard ``index`` runs on worker ``index`` (mod the workers). With
    per-prompt counts, ``counts`` gives each of its prompts' sample count (all of that prompt's samples)."""

    index: int
    prompts: range
    samples: range
    counts: Optional[tuple] = None

    @property
    def n(self):
        """What the shard's ``generate`` call asks: one N, or the per-prompt counts."""
        return list(self.counts) if self.counts is not None else len(self.samples)

    @property
    def rows(self) -> int:
        return sum(self.counts) if self.counts is not None else len(self.prompts) * len(self.samples)


def _even_ranges(total: int, parts: int) -> list[range]:
    """``parts`` contiguous ranges covering ``0..total-1`` whose sizes differ by at most one (larger ones first)."""
    sizes = [total // parts + (i < total % parts) for i in range(parts)]
    starts = [sum(sizes[:i]) for i in range(parts)]
    return [range(s, s + k) for s, k in zip(starts, sizes)]


def plan_shards(num_prompts: int, n: int, workers: int) -> list[Shard]:
    """Split ``num_prompts`` prompts x ``n`` samples into at most ``workers`` shards (see the module docstring),
    ordered so that concatenating their rows is prompt-major.

    >>> [(s.prompts, s.samples) for s in plan_shards(5, 4, 2)]   # by prompts: 3 + 2
    [(range(0, 3), range(0, 4)), (range(3, 5), range(0, 4))]
    >>> [(s.prompts, s.samples) for s in plan_shards(1, 6, 2)]   # one prompt: its samples 3 + 3
    [(range(0, 1), range(0, 3)), (range(0, 1), range(3, 6))]
    """
    if is_per_prompt(n):
        return _plan_ragged_shards(per_prompt_counts(n, num_prompts), workers)
    for name, v in (("num_prompts", num_prompts), ("n", n), ("workers", workers)):
        check_int(name, v, 1)
    if num_prompts >= workers:
        blocks = [(r, range(n)) for r in _even_ranges(num_prompts, workers)]
    else:
        per_prompt = [min(n, workers // num_prompts + (p < workers % num_prompts)) for p in range(num_prompts)]
        blocks = [(range(p, p + 1), s) for p, k in enumerate(per_prompt) for s in _even_ranges(n, k)]
    return [Shard(i, p, s) for i, (p, s) in enumerate(blocks)]


def _plan_ragged_shards(counts: list[int], workers: int) -> list[Shard]:
    """Shards of a per-prompt allocation, balanced by samples (see the module docstring): prompts above
    ``target = ceil(sum N_p / W)`` split into one-prompt sample ranges, runs of the others packed whole."""
    check_int("workers", workers, 1)
    for p, k in enumerate(counts):
        check_int(f"n[{p}]", k, 1)
    target = math.ceil(sum(counts) / workers)
    blocks: list[tuple[range, range, Optional[tuple]]] = []
    run: list[int] = []  # consecutive prompts packed into the current shard

    def close_run():
        if run:
            blocks.append((range(run[0], run[-1] + 1), range(0), tuple(counts[p] for p in run)))
            run.clear()

    for p, k in enumerate(counts):
        if k > target:
            close_run()
            blocks += [(range(p, p + 1), r, None) for r in _even_ranges(k, math.ceil(k / target))]
        else:
            if run and sum(counts[q] for q in run) + k > target:
                close_run()
            run.append(p)
    close_run()
    return [Shard(i, pr, (range(counts[pr.start]) if c is not None and len(c) == 1 else sr),
                  c if c is not None and len(c) > 1 else None) for i, (pr, sr, c) in enumerate(blocks)]


def shard_seed(seed: int, shard: Shard) -> int:
    """A 31-bit seed for ``shard`` from the call's seed and the shard's first (prompt, sample): stable across
    processes and machines (sha256, not Python's salted ``hash``)."""
    return derive_seed(int(seed), "ray-shard", shard.prompts.start, shard.samples.start)


def shard_sampling(sampling: RolloutSampling, shard: Shard, num_shards: int) -> RolloutSampling:
    """The sampling a shard runs with: the call's own when there is one shard or no seed, else seed_i."""
    if sampling.seed is None or num_shards == 1:
        return sampling
    return replace(sampling, seed=shard_seed(sampling.seed, shard))


def merge_shards(prompts: Sequence[str], n, shards: Sequence[Shard], parts: Sequence[RolloutBatch],
                 meta: Optional[dict] = None) -> RolloutBatch:
    """Join shard results (``parts[i]`` from ``shards[i]``, each [P_i*N_i, T_i]) into one prompt-major batch
    [P*N, max T_i].

    Each part is viewed as N_i one-sample groups (rows unchanged) so :meth:`RolloutBatch.concat` does the padding
    (ids -> pad_id, logprobs -> 0); since shards are ordered by (first prompt, first sample) the concatenated rows
    are exactly b = p*N + s, and the result is relabelled with the call's prompts and N.
    """
    if len(parts) != len(shards):
        raise ValueError(f"parts: got {len(parts)} batches for {len(shards)} shards")
    flat = []
    prompt_ids: list = [None] * len(prompts)
    for shard, part in zip(shards, parts):
        if part.num_prompts != len(shard.prompts) or part.group_sizes.tolist() != per_prompt_counts(
                shard.n, len(shard.prompts)):
            raise ValueError(f"parts[{shard.index}]: {part.num_prompts} prompts x {part.n} samples, expected "
                             f"{len(shard.prompts)} x {shard.n}")
        for j, p in enumerate(shard.prompts):
            prompt_ids[p] = part.prompt_ids[j]
        rep = lambda xs: [xs[j] for j in part.prompt_index.tolist()]  # noqa: E731  [P_i] -> [rows_i]
        flat.append(replace(part, prompts=rep(part.prompts), prompt_ids=rep(part.prompt_ids), n=1, items=None,
                            sizes=None))
    joined = RolloutBatch.concat(flat)
    sizes = per_prompt_counts(n, len(prompts)) if is_per_prompt(n) else None
    return replace(joined, prompts=list(prompts), prompt_ids=prompt_ids, n=max(sizes) if sizes else n,
                   sizes=sizes, meta=dict(meta if meta is not None else parts[0].meta)).validate()


def _merged_meta(engine: str, worker_engine: str, sampling: RolloutSampling, shards: Sequence[Shard],
                 parts: Sequence[RolloutBatch], seeds: Sequence[Optional[int]], seconds: float) -> dict:
    """Batch meta of a split call: the first part's engine-specific keys, then the call-level figures."""
    tokens = sum(int(p.meta.get("generated_tokens", int(p.lengths.sum()))) for p in parts)
    samples = sum(s.rows for s in shards)
    return {**parts[0].meta, "engine": engine, "worker_engine": worker_engine, "sampling": asdict(sampling),
            "temperature": sampling.temperature, "top_p": sampling.top_p, "generation_seconds": seconds,
            "generated_tokens": tokens, "samples_per_second": samples / max(seconds, 1e-9),
            "tokens_per_second": tokens / max(seconds, 1e-9),
            "shards": [{"worker": s.index, "prompts": [s.prompts.start, s.prompts.stop],
                        **({"counts": list(s.counts)} if s.counts is not None else {}),
                        "samples": [s.samples.start, s.samples.stop], "seed": seed,
                        "generation_seconds": p.meta.get("generation_seconds")}
                       for s, p, seed in zip(shards, parts, seeds)]}


def generate_sharded(engine: RolloutEngine, prompts: Sequence[str], n, sampling: RolloutSampling, *,
                     workers: int) -> RolloutBatch:
    """In-process reference for :class:`RayEngine`: run the shards of ``plan_shards(P, n, workers)`` one after the
    other on ``engine`` with their seeds and merge them. With the same wrapped engine, weights and ``sampling.seed``
    this is the batch ``RayEngine(..., workers=workers).generate(prompts, n, sampling)`` returns."""
    check_generate_args(prompts, n)
    shards = plan_shards(len(prompts), n, workers)
    t0 = time.perf_counter()
    runs = [shard_sampling(sampling, s, len(shards)) for s in shards]
    parts = [engine.generate(list(prompts[s.prompts.start:s.prompts.stop]), s.n, sp) for s, sp in zip(shards, runs)]
    meta = _merged_meta(engine.name, engine.name, sampling, shards, parts, [sp.seed for sp in runs],
                        time.perf_counter() - t0)
    return merge_shards(prompts, n, shards, parts, meta)


# ---- weights ------------------------------------------------------------------------------------------------------
def state_checksum(state: dict, dtype: Optional[torch.dtype] = None) -> str:
    """sha256 over a state dict's names and tensor bytes (cast to ``dtype`` first when given): equal checksums mean
    equal weights. Used to confirm that every worker holds what the trainer synced."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        h.update(name.encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _cpu_state(model: torch.nn.Module, dtype: torch.dtype) -> dict:
    """The model's state dict on CPU, floating tensors cast to the workers' dtype (what travels in the object store)."""
    return {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
            for k, v in model.state_dict().items()}


@dataclass
class _ModuleSpec:
    """An ``nn.Module`` in a form that travels: its class (pickled by reference), HF config and CPU state dict."""

    cls: type
    config: object
    state: dict

    def build(self) -> torch.nn.Module:
        from transformers.initialization import no_init_weights

        with no_init_weights():  # the weights are loaded right after: skip the random init (slow at 1.5B)
            module = self.cls(self.config)
        module.load_state_dict(self.state)
        return module.eval()


class _SyncedWeights:
    """A received state dict, offered to the wrapped engine's ``sync_weights(model)`` the way engines read a
    trainer's model (``model.state_dict()``)."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


# ---- the actor ----------------------------------------------------------------------------------------------------
class _RolloutWorker:
    """Body of one Ray actor: builds its engine with :func:`brorl_lab.rollout.engines.make_engine` and serves calls.

    Construction never raises: an error is kept and re-raised by every call, so the driver receives it as a
    ``RayTaskError`` carrying the original exception (an ``__init__`` failure would only say the actor died).
    """

    def __init__(self, index: int, engine: str, source, tokenizer, device: str, dtype: str, threads: int,
                 engine_kw: dict, weights, version: int):
        self.index, self.engine_name, self.version, self.error = index, engine, 0, None
        self.device, self.dtype, self.threads = device, dtype, threads
        try:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vllm in-process inside the actor
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            torch.set_num_threads(threads)  # processes side by side must not oversubscribe the cores
            from brorl_lab.rollout.engines import make_engine

            model = source.build() if isinstance(source, _ModuleSpec) else source
            self.engine = make_engine(engine, model, tokenizer, device=device, dtype=dtype, **engine_kw)
            del model
            if weights is not None:
                self.load_weights(weights, version)
        except Exception as e:  # noqa: BLE001  re-raised by every call (see class docstring)
            self.error = e

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def generate(self, prompts: list, n: int, sampling: RolloutSampling) -> RolloutBatch:
        self._check()
        batch = self.engine.generate(prompts, n, sampling)
        batch.meta["ray_worker"] = self.index
        return batch

    def load_weights(self, state: dict, version: int) -> int:
        self._check()
        self.engine.sync_weights(_SyncedWeights(state))
        self.version = version
        return version

    def info(self, checksum: bool = False) -> dict:
        """Where this worker runs and what it holds; ``checksum`` hashes the engine's weights (torch/hf engines)."""
        self._check()
        import ray

        model = getattr(self.engine, "model", None)
        module = model if isinstance(model, torch.nn.Module) else None
        out = {"worker": self.index, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
               "engine": self.engine_name, "device": self.device, "dtype": self.dtype, "threads": self.threads,
               "torch_threads": torch.get_num_threads(), "weights_version": self.version,
               "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        if checksum:
            out["checksum"] = None if module is None else state_checksum(module.state_dict())
        return out


@functools.lru_cache(maxsize=1)
def _actor_class():
    import ray

    return ray.remote(_RolloutWorker)


def _cause(err: BaseException) -> BaseException:
    """The original exception inside a Ray error (``RayTaskError.cause``), else the error itself."""
    return getattr(err, "cause", None) or err


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


# ---- the engine ---------------------------------------------------------------------------------------------------
class RayEngine(RolloutEngine):
    """A pool of ``workers`` Ray actors, each wrapping a ``worker_engine`` (``'torch'``, ``'hf'`` or ``'vllm'``).

    ``RayEngine(model, tokenizer=None, *, workers=2, worker_engine="torch", address=None, device="auto",
    dtype="auto", num_cpus_per_worker=None, num_gpus_per_worker=None, local_cpus=None, max_retries=1,
    timeout_s=1800, start_timeout_s=600, **engine_kw)``

    - ``model``: ``'default'``, a local HF directory, a hub id (each actor loads it) or a HF causal-LM ``nn.Module``
      (shipped through the object store; needs ``tokenizer``). ``engine_kw`` go to every wrapped engine.
    - ``device``/``dtype`` are resolved here and forwarded: ``'auto'`` is CUDA + bfloat16 when workers get GPUs,
      else CPU + float32.
    - ``num_gpus_per_worker``: GPUs each actor reserves (Ray sets its ``CUDA_VISIBLE_DEVICES``); ``None`` -> 1 when
      ``device='cuda'``, or ``device='auto'`` and the cluster has GPUs; else 0. Fractions share a GPU.
    - ``num_cpus_per_worker``: CPUs each actor reserves and its torch thread count (``max(1, floor(.))``); ``None``
      -> ``max(1, cluster CPUs // workers)``, capped at the largest node's CPUs.
    - ``max_retries``: fresh actors tried per shard after a worker dies; ``timeout_s``: deadline of one call
      (generate, sync) on a worker; ``start_timeout_s``: deadline for actors to start.
    """

    name = "ray"

    def __init__(self, model="default", tokenizer=None, *, workers: int = 2, worker_engine: str = "torch",  # noqa: C901 - argument checks and the actor pool's start, in the order a reader checks them
                 address: Optional[str] = None, device: str = "auto", dtype: str = "auto",
                 num_cpus_per_worker: Optional[float] = None, num_gpus_per_worker: Optional[float] = None,
                 local_cpus: Optional[int] = None, max_retries: int = 1, timeout_s: float = 1800.0,
                 start_timeout_s: float = 600.0, **engine_kw):
        from brorl_lab.core.models import DEVICES, DTYPES, resolve_model

        self._closed, self._owns_ray, self._actors = True, False, []  # safe close() if validation fails
        _check_int("workers", workers, 1)
        if worker_engine not in WORKER_ENGINES:
            raise ValueError(f"worker_engine: got {worker_engine!r}; allowed: {', '.join(WORKER_ENGINES)}")
        if address is not None and not (isinstance(address, str) and address.strip()):
            raise ValueError(f"address: got {address!r}; allowed: None (local), 'auto', 'host:port' or "
                             "'ray://host:port'")
        if device not in DEVICES:
            raise ValueError(f"device: got {device!r}; allowed: {', '.join(DEVICES)}")
        if dtype != "auto" and dtype not in DTYPES:
            raise ValueError(f"dtype: got {dtype!r}; allowed: auto, {', '.join(DTYPES)}")
        for name, v in (("num_cpus_per_worker", num_cpus_per_worker), ("num_gpus_per_worker", num_gpus_per_worker)):
            if v is not None and (not is_number(v) or not math.isfinite(v)
                                  or v < (0 if name == "num_gpus_per_worker" else 1e-9)):
                raise ValueError(f"{name}: got {v!r}; allowed: None or a number "
                                 f"{'>= 0' if name == 'num_gpus_per_worker' else '> 0'}")
        if device == "cuda" and num_gpus_per_worker == 0:
            raise ValueError("num_gpus_per_worker: got 0 with device='cuda'; allowed: > 0 (an actor without a GPU "
                             "reservation sees no CUDA device)")
        if local_cpus is not None:
            _check_int("local_cpus", local_cpus, 1)
        _check_int("max_retries", max_retries, 0)
        for name, v in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if not is_number(v) or not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}: got {v!r}; allowed: a finite number of seconds > 0")
        if isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("tokenizer: got None with an nn.Module model; allowed: the model's HF tokenizer")
        elif isinstance(model, (str, Path)):
            model = resolve_model(str(model))  # a local directory is checked here; every actor loads it itself
        else:
            raise ValueError(f"model: got {type(model).__name__}; allowed: 'default', a local HF model directory, a "
                             "hub id or a torch nn.Module (HF causal LM)")

        self.workers, self.worker_engine = workers, worker_engine
        self.max_retries, self.timeout_s, self.start_timeout_s = max_retries, float(timeout_s), float(start_timeout_s)
        self.engine_kw = dict(engine_kw)
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(model)
        self._owns_ray = _connect(address, local_cpus)
        self._closed = False
        try:
            self._place(device, dtype, num_cpus_per_worker, num_gpus_per_worker)
            self._start(model, tokenizer)
        except BaseException:
            self.close()
            raise

    # ---- construction ---------------------------------------------------------------------------------------------
    def _place(self, device, dtype, num_cpus, num_gpus) -> None:
        """Resolve what each actor reserves and the device/dtype it will see.

        Requests are checked against the cluster now: one that no node can host, or that the cluster's free
        resources cannot cover (e.g. held by another engine's actors), is a ValueError instead of actors queued
        until ``start_timeout_s``. Default CPUs: the free CPUs split evenly (whole CPUs when there are enough,
        else a fraction), so a second engine on a busy cluster still fits.
        """
        from brorl_lab.core.models import pick_dtype

        W = self.workers
        total, max_node = _cluster_resources()
        if num_gpus is None:
            num_gpus = 1 if device == "cuda" or (device == "auto" and total.get("GPU", 0) > 0) else 0
        free = _free_resources(W * (num_cpus or 1), W * num_gpus)
        if num_cpus is None:
            avail = free.get("CPU", 0.0)
            num_cpus = max(1, int(min(avail // W, max_node.get("CPU", 1)))) if avail >= W else avail / W
            if num_cpus <= 0:
                raise ValueError("num_cpus_per_worker: no CPU of the Ray cluster is free; allowed: close other "
                                 "engines holding it, or pass a small fraction such as 0.1")
        for key, name, per in (("CPU", "num_cpus_per_worker", num_cpus), ("GPU", "num_gpus_per_worker", num_gpus)):
            if per > max_node.get(key, 0.0) + 1e-9:
                raise ValueError(f"{name}: got {per:g}; no node of this cluster has that many {key}s "
                                 f"(largest: {max_node.get(key, 0.0):g}, cluster: {total.get(key, 0.0):g})")
            if per * W > free.get(key, 0.0) + 1e-9:
                raise ValueError(f"{name}: {per:g} x {W} workers but only {free.get(key, 0.0):g} {key}s of the "
                                 f"cluster are free ({total.get(key, 0.0):g} in all); allowed: at most "
                                 f"{free.get(key, 0.0) / W:g} per worker (fractions share), or close the engines "
                                 "holding them")
        self.device = device if device != "auto" else ("cuda" if num_gpus > 0 else "cpu")
        self.dtype = pick_dtype(dtype, self.device)
        self.num_cpus_per_worker, self.num_gpus_per_worker = num_cpus, num_gpus
        self.threads = max(1, int(num_cpus))  # torch threads per actor: its CPU share, at least one

    def _start(self, model, tokenizer) -> None:
        import ray

        if isinstance(model, torch.nn.Module):
            self._source = ray.put(_ModuleSpec(type(model), model.config, _cpu_state(model, self.dtype)))
        else:
            self._source = model
        self._tokenizer_ref = None if tokenizer is None else ray.put(tokenizer)
        self._weights_ref, self.weights_version = None, 0
        self.restarts = [0] * self.workers
        self._dead: set[int] = set()
        self._actors = [self._spawn(i) for i in range(self.workers)]
        self._call([(i, "info", ()) for i in range(self.workers)], "start", retry=False,
                   timeout_s=self.start_timeout_s)

    def _spawn(self, i: int):
        """A fresh actor for worker ``i``, starting from the latest synced weights."""
        dtype_name = str(self.dtype).removeprefix("torch.")
        opts = {"num_cpus": self.num_cpus_per_worker, "num_gpus": self.num_gpus_per_worker,
                "scheduling_strategy": "SPREAD", "max_restarts": 0, "max_task_retries": 0}
        return _actor_class().options(**opts).remote(
            i, self.worker_engine, self._source, self._tokenizer_ref, self.device, dtype_name, self.threads,
            self.engine_kw, self._weights_ref, self.weights_version)

    def _respawn(self, i: int) -> None:
        import ray

        try:
            ray.kill(self._actors[i], no_restart=True)
        except Exception:  # noqa: BLE001  already gone
            pass
        self._actors[i] = self._spawn(i)
        self.restarts[i] += 1
        self._dead.discard(i)

    # ---- calls with deadlines and retries ----------------------------------------------------------------------------
    def _call(self, tasks: list[tuple[int, str, tuple]], what: str, *, retry: bool = True,  # noqa: C901 - one dispatch loop with its retry and failure paths side by side
              timeout_s: Optional[float] = None) -> list:
        """Run ``actor_i.method(*args)`` for each ``(i, method, args)``; results in task order.

        Never waits past a deadline: each task must answer within ``timeout_s`` of its submission (a rerun on a fresh
        actor also gets ``start_timeout_s``). A dead worker is replaced and its task rerun (``max_retries`` times when
        ``retry``); anything else becomes one error naming the worker.
        """
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        fresh = sorted(self._dead)  # lost in an earlier call (timed out, or died with no retries left)
        for i in fresh:
            self._respawn(i)
        pending: dict = {}  # ref -> (task index, attempt, deadline)

        def submit(k: int, attempt: int, extra: float = 0.0) -> None:
            i, method, args = tasks[k]
            ref = getattr(self._actors[i], method).remote(*args)
            pending[ref] = (k, attempt, time.monotonic() + timeout_s + extra)

        for k in range(len(tasks)):
            submit(k, 0, extra=self.start_timeout_s if tasks[k][0] in fresh else 0.0)
        results: list = [None] * len(tasks)
        try:
            while pending:
                wait_s = max(0.0, min(d for _, _, d in pending.values()) - time.monotonic())
                # short slices: Python signal handlers (Ctrl-C in a notebook, test timeouts) run between them
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(wait_s, 1.0))
                if not ready:
                    late = [tasks[k][0] for k, _, d in pending.values() if d <= time.monotonic()]
                    if not late:
                        continue
                    self._dead.update(late)
                    for i in late:
                        ray.kill(self._actors[i], no_restart=True)
                    hint = (f"each asks {self.num_cpus_per_worker:g} CPU, {self.num_gpus_per_worker:g} GPU; free "
                            f"now: {_short(ray.available_resources())}" if what == "start" else
                            "raise timeout_s for longer generations")
                    raise RuntimeError(f"RayEngine {what}: ray worker(s) {sorted(late)} ({self.worker_engine} engine) "
                                       f"did not answer within {timeout_s:g} s; killed (they are replaced at the "
                                       f"next call); {hint}")
                ref = ready[0]
                k, attempt, _ = pending.pop(ref)
                i = tasks[k][0]
                try:
                    results[k] = ray.get(ref, timeout=0)
                except RayTaskError as e:  # raised inside the wrapped engine (or while building it)
                    cause = _cause(e)
                    kind = ValueError if isinstance(cause, (ValueError, TypeError)) else RuntimeError
                    raise kind(f"RayEngine {what}: ray worker {i} ({self.worker_engine} engine) failed: "
                               f"{_one_line(cause)}") from e
                except RayActorError as e:  # the actor process is gone
                    if not retry or attempt >= self.max_retries:
                        self._dead.add(i)  # the next call starts a fresh actor
                        raise RuntimeError(f"RayEngine {what}: ray worker {i} ({self.worker_engine} engine) died "
                                           f"and {attempt} replacement(s) were tried (max_retries="
                                           f"{self.max_retries}): {_one_line(e)}") from e
                    self._respawn(i)
                    submit(k, attempt + 1, extra=self.start_timeout_s)
        finally:
            for ref in pending:  # after an error: do not leave the other workers busy with a dead call
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001  its actor is already gone
                    pass
        return results

    # ---- the interface ----------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], n, sampling: RolloutSampling) -> RolloutBatch:
        """N samples per prompt from the pool, as one prompt-major batch (see the module docstring for the split and
        the seeds); ``n`` may give each prompt its own N_p (split by samples across the workers).
        ``batch.meta['shards']`` records which worker produced which rows, with which seed."""
        check_generate_args(prompts, n)
        if not isinstance(sampling, RolloutSampling):
            raise ValueError(f"sampling: got {type(sampling).__name__}; allowed: a RolloutSampling")
        self._check_open()
        prompts = list(prompts)
        shards = plan_shards(len(prompts), n, self.workers)
        runs = [shard_sampling(sampling, s, len(shards)) for s in shards]
        t0 = time.perf_counter()
        parts = self._call([(s.index % self.workers, "generate", (prompts[s.prompts.start:s.prompts.stop], s.n, sp))
                            for s, sp in zip(shards, runs)], "generate")
        meta = _merged_meta(self.name, self.worker_engine, sampling, shards, parts, [sp.seed for sp in runs],
                            time.perf_counter() - t0)
        meta["ray_workers"] = self.workers
        for d in meta["shards"]:  # shard i ran on worker i mod W (a per-prompt n may make more shards than workers)
            d["shard"], d["worker"] = d["worker"], d["worker"] % self.workers
        return merge_shards(prompts, n, shards, parts, meta)

    def sync_weights(self, model) -> None:
        """Broadcast the trainer's weights: one ``ray.put`` of the CPU state dict (in the workers' dtype), which
        every actor loads; kept as the starting weights of any replacement actor."""
        import ray

        self._check_open()
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model: got {type(model).__name__}; allowed: the trainer's torch nn.Module")
        previous = (self._weights_ref, self.weights_version)
        self._weights_ref, self.weights_version = ray.put(_cpu_state(model, self.dtype)), self.weights_version + 1
        try:
            self._call([(i, "load_weights", (self._weights_ref, self.weights_version)) for i in range(self.workers)],
                       "sync_weights")
        except ValueError:  # the weights did not fit: keep the previous ones for replacements
            self._weights_ref, self.weights_version = previous
            raise

    def worker_info(self, checksum: bool = False) -> list[dict]:
        """One dict per worker: pid, node id, device, dtype, threads, ``weights_version`` (syncs it holds) and, with
        ``checksum``, :func:`state_checksum` of its engine's weights (None for engines without a torch module)."""
        self._check_open()
        info = self._call([(i, "info", (checksum,)) for i in range(self.workers)], "worker_info")
        for d in info:
            d["restarts"] = self.restarts[d["worker"]]
        return info

    def close(self) -> None:
        """Kill the actors and, if this engine started Ray, shut it down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            import ray

            for a in self._actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001  already dead
                    pass
            self._actors, self._source, self._weights_ref, self._tokenizer_ref = [], None, None, None
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
        finally:
            self._owns_ray = False

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("engine: this RayEngine was closed; allowed: build a new engine")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"device={self.device}, dtype={str(self.dtype).removeprefix('torch.')}"
        return f"RayEngine(workers={self.workers}, worker_engine={self.worker_engine!r}, {state})"


def _check_int(name: str, value, low: int) -> None:
    if not is_int(value) or value < low:
        raise ValueError(f"{name}: got {value!r}; allowed: an integer >= {low}")


def _load_tokenizer(model: str):
    """The driver's own tokenizer for a model name/dir (for prompt templates, ``engine.tokenizer``)."""
    from brorl_lab.core.models import load_tokenizer

    try:
        return load_tokenizer(model)
    except OSError as e:
        raise ValueError(f"model: could not load the tokenizer of {model!r} ({e}); allowed: 'default', a local HF "
                         "model directory or a hub id available offline") from e


def _cluster_resources() -> tuple[dict, dict]:
    """``(cluster totals, largest amount of each resource on one alive node)``."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    largest = {k: max(r.get(k, 0.0) for r in nodes) for k in ("CPU", "GPU")} if nodes else {}
    return ray.cluster_resources(), largest


def _free_resources(cpus: float, gpus: float, grace_s: float = 5.0) -> dict:
    """Free resources of the cluster, polled for up to ``grace_s`` until ``cpus``/``gpus`` are free (the count
    lags for a moment after actors of a closed engine exit)."""
    import ray

    deadline = time.monotonic() + grace_s
    while True:
        free = ray.available_resources()
        enough = free.get("CPU", 0.0) + 1e-9 >= cpus and free.get("GPU", 0.0) + 1e-9 >= gpus
        if enough or time.monotonic() >= deadline:
            return free
        time.sleep(0.25)


def _short(resources: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in resources.items() if k in ("CPU", "GPU"))


def _connect(address: Optional[str], local_cpus: Optional[int]) -> bool:
    """Join or start Ray; returns True when this call started (or connected) it and close() should shut it down."""
    import ray

    if ray.is_initialized():
        return False  # someone else's cluster/connection: never shut it down
    if address is None:
        for attempt in (1, 2):  # Ray gives its raylet 30 s to register; an overloaded machine can miss that once
            try:
                ray.init(address="local", num_cpus=local_cpus, include_dashboard=False, log_to_driver=False)
                break
            except Exception as e:  # noqa: BLE001  Ray raises a bare Exception for this
                ray.shutdown()
                if attempt == 2 or "timed out during startup" not in str(e):
                    raise RuntimeError(f"RayEngine: could not start a local Ray cluster ({e})") from e
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            raise ValueError(f"address: could not connect to a Ray cluster at {address!r} ({e}); allowed: the "
                             "address printed by `ray start --head` (or 'auto' on a node of the cluster)") from e
    return True


__all__ = ["RayEngine", "Shard", "plan_shards", "shard_seed", "shard_sampling", "merge_shards", "generate_sharded",
           "state_checksum", "WORKER_ENGINES"]
