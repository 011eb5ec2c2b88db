"""RayEngine on a real local Ray cluster (2 CPUs, one per module) with real tiny Qwen2 models.

What is checked: the split plan covers every (prompt, sample) once in prompt-major order; the pool returns exactly
the batch of the wrapped engine run in-process with the same split and seeds; synced weights reach every worker
(outputs and per-worker checksums), also a replacement worker; a killed worker is replaced transparently (same
batch) or, with no retries left, reported as one error, and the engine recovers; a worker that misses its deadline
is reported, not waited on; bad inputs raise ValueError; close() is idempotent and shuts down only a cluster the
engine started.
"""

import copy
import itertools
import time

import pytest
import torch
from helpers_models import bias_token, save_tiny, tiny_qwen2, tiny_tokenizer

from brorl_lab.rollout.engines import RolloutSampling, make_engine
from brorl_lab.rollout.engines.ray_engine import (
    RayEngine,
    generate_sharded,
    merge_shards,
    plan_shards,
    shard_sampling,
    state_checksum,
)

PROMPTS = ["12+7=", "abc", "Hello, world", "x"]
SP = RolloutSampling(temperature=1.0, max_new_tokens=12, seed=1234)


def same_batch(a, b) -> None:
    assert a.n == b.n and a.prompts == b.prompts and a.prompt_ids == b.prompt_ids
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    assert torch.equal(a.lengths, b.lengths) and torch.equal(a.truncated, b.truncated)
    assert a.texts == b.texts


# ---- the split (no cluster) ----------------------------------------------------------------------------------------
def test_plan_covers_every_sample_once_in_prompt_major_order():
    for P, N, W in itertools.product([1, 2, 3, 7], [1, 2, 5, 16], [1, 2, 3, 4, 8]):
        shards = plan_shards(P, N, W)
        assert 1 <= len(shards) <= W and [s.index for s in shards] == list(range(len(shards)))
        cells = [(p, s) for sh in shards for p in sh.prompts for s in sh.samples]
        assert cells == [(p, s) for p in range(P) for s in range(N)]  # each once, prompt-major
        assert len(shards) == min(W, P * N) if P < W else len(shards) == W
        if P >= W:  # by prompts, near-equal
            assert max(len(s.prompts) for s in shards) - min(len(s.prompts) for s in shards) <= 1
    for bad in [(0, 4, 2), (2, 0, 2), (2, 4, 0), (2, 4, True), (2.0, 4, 2)]:
        with pytest.raises(ValueError):
            plan_shards(*bad)


def test_shard_seeds_are_distinct_and_one_shard_keeps_the_seed():
    shards = plan_shards(1, 8, 4)
    seeds = [shard_sampling(SP, s, len(shards)).seed for s in shards]
    assert len(set(seeds)) == 4 and SP.seed not in seeds
    assert shard_sampling(SP, shards[0], 1) is SP
    assert shard_sampling(RolloutSampling(seed=None), shards[1], 4).seed is None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny_ray"))


@pytest.fixture(scope="module")
def local(model_dir):
    """The wrapped engine in-process, on one thread like each of the two actors (float sums depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = make_engine("torch", str(model_dir), device="cpu")
    yield engine
    engine.close()
    torch.set_num_threads(threads)


def test_reference_with_one_worker_is_the_wrapped_engine(local):
    same_batch(generate_sharded(local, PROMPTS, 3, SP, workers=1), local.generate(PROMPTS, 3, SP))
    split = generate_sharded(local, PROMPTS[:1], 6, SP, workers=2)
    assert split.size == 6 and split.meta["shards"][1]["samples"] == [3, 6]
    with pytest.raises(ValueError, match="parts"):
        merge_shards(PROMPTS, 3, plan_shards(4, 3, 2), [local.generate(PROMPTS[:2], 3, SP)])


def test_bad_constructor_arguments_raise_before_touching_ray(model_dir):
    import ray

    before = ray.is_initialized()
    module, tok = tiny_qwen2(len(tiny_tokenizer())), tiny_tokenizer()
    cases = [({"workers": 0}, "workers"), ({"workers": 1.5}, "workers"), ({"worker_engine": "ray"}, "worker_engine"),
             ({"device": "gpu"}, "device"), ({"dtype": "fp8"}, "dtype"), ({"num_gpus_per_worker": -1}, "num_gpus"),
             ({"num_cpus_per_worker": 0}, "num_cpus"), ({"device": "cuda", "num_gpus_per_worker": 0}, "num_gpus"),
             ({"timeout_s": 0}, "timeout_s"), ({"start_timeout_s": float("inf")}, "start_timeout_s"),
             ({"max_retries": -1}, "max_retries"), ({"address": ""}, "address"), ({"local_cpus": 0}, "local_cpus")]
    for kw, name in cases:
        with pytest.raises(ValueError, match=name):
            RayEngine(str(model_dir), **kw)
    with pytest.raises(ValueError, match="model"):
        RayEngine(42)
    with pytest.raises(ValueError, match="model"):
        RayEngine("./no/such/model_dir")
    with pytest.raises(ValueError, match="tokenizer"):
        RayEngine(module)
    assert ray.is_initialized() == before
    del tok


# ---- on the cluster --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(model_dir):
    """Two torch-engine workers; this engine starts the module's one local cluster (2 CPUs) and owns it. They
    reserve half a CPU each (one torch thread), so the other engines of this module fit beside them."""
    import ray

    assert not ray.is_initialized(), "another Ray session is open in this process"
    engine = RayEngine(str(model_dir), workers=2, worker_engine="torch", local_cpus=2, num_cpus_per_worker=0.5,
                       device="cpu", start_timeout_s=240, timeout_s=120)
    yield engine
    engine.close()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_pool_returns_the_in_process_batch_for_the_same_seed(pool, local):
    info = pool.worker_info()
    assert [d["torch_threads"] for d in info] == [1, 1] and len({d["pid"] for d in info}) == 2
    for prompts, n in [(PROMPTS[:3], 4), (PROMPTS[:1], 6)]:  # split by prompts; one prompt's samples split
        batch = pool.generate(prompts, n, SP)
        same_batch(batch, generate_sharded(local, prompts, n, SP, workers=2))
        assert [s["worker"] for s in batch.meta["shards"]] == [0, 1] and batch.meta["engine"] == "ray"
        same_batch(pool.generate(prompts, n, SP), batch)  # deterministic in the seed
    halves = batch.response_ids.view(2, 3, -1)
    assert not torch.equal(halves[0], halves[1])  # the two workers' halves of one prompt used different seeds
    other = pool.generate(PROMPTS[:1], 6, RolloutSampling(max_new_tokens=12, seed=99))
    assert not torch.equal(other.response_ids, batch.response_ids)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_pool_splits_a_per_prompt_n_by_samples_and_equals_the_in_process_reference(pool, local):
    """A per-prompt N (rollout allocation, issue 44) on the pool: shards cut by samples, not prompts, and the
    batch equals the in-process reference drawn shard by shard."""
    counts = [1, 9, 2, 3]  # 15 samples, 8 a worker: prompt 1 is cut, four shards on two workers
    got, want = pool.generate(PROMPTS, counts, SP), generate_sharded(local, PROMPTS, counts, SP, workers=2)
    assert got.group_sizes.tolist() == counts and torch.equal(got.response_ids, want.response_ids)
    assert got.texts == want.texts and torch.equal(got.logprobs, want.logprobs)
    assert [(s["shard"], s["worker"]) for s in got.meta["shards"]] == [(0, 0), (1, 1), (2, 0), (3, 1)]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_sync_reaches_every_worker_and_a_replacement(pool, local, model_dir):
    import ray
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    stopped = copy.deepcopy(policy)
    bias_token(stopped, local.tokenizer.eos_token_id, 40.0)  # the new policy ends every response at once
    pool.sync_weights(stopped)
    want = state_checksum(stopped.state_dict(), torch.float32)
    info = pool.worker_info(checksum=True)
    assert [d["checksum"] for d in info] == [want, want] and [d["weights_version"] for d in info] == [1, 1]
    batch = pool.generate(PROMPTS[:2], 4, SP)  # one prompt per worker
    assert batch.lengths.tolist() == [1] * 8 and set(batch.texts) == {""}

    old_pid = info[1]["pid"]
    ray.kill(pool._actors[1], no_restart=True)
    _wait_dead(pool._actors[1])
    batch = pool.generate(PROMPTS[:2], 4, SP)  # worker 1 is replaced and starts from the synced weights
    assert batch.lengths.tolist() == [1] * 8
    info = pool.worker_info(checksum=True)
    assert info[1]["pid"] != old_pid and info[1]["restarts"] == 1 and info[1]["checksum"] == want

    pool.sync_weights(policy)  # back to the original weights: the in-process reference agrees again
    same_batch(pool.generate(PROMPTS, 3, SP), generate_sharded(local, PROMPTS, 3, SP, workers=2))
    assert {d["weights_version"] for d in pool.worker_info()} == {2}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_bad_calls_raise_value_error_and_leave_the_pool_usable(pool, model_dir):
    for args in [("12+7=", 2, SP), ([], 2, SP), (PROMPTS, 0, SP), (PROMPTS, 2, {"seed": 1})]:
        with pytest.raises(ValueError):
            pool.generate(*args)
    with pytest.raises(ValueError, match="model"):
        pool.sync_weights("weights")
    version = pool.weights_version
    with pytest.raises(ValueError, match="ray worker .*model"):  # another architecture: the workers refuse it
        pool.sync_weights(tiny_qwen2(len(tiny_tokenizer()), hidden=32))
    assert pool.weights_version == version
    # Requests the cluster cannot host fail now instead of queueing: no GPU here; 1 of 2 CPUs held by the pool.
    with pytest.raises(ValueError, match="num_gpus_per_worker"):
        RayEngine(str(model_dir), workers=1, num_gpus_per_worker=1)
    with pytest.raises(ValueError, match="num_cpus_per_worker: 0.5 x 4 workers but only 1 CPUs"):
        RayEngine(str(model_dir), workers=4, num_cpus_per_worker=0.5)
    with pytest.raises(ValueError, match="ray worker 0 .*chunk_sequences"):  # the wrapped engine refuses to start
        RayEngine(str(model_dir), workers=1, num_cpus_per_worker=0.5, chunk_sequences=0)
    assert pool.generate(PROMPTS[:1], 2, SP).size == 2


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_dead_or_late_worker_is_one_clear_error_then_recovered(pool, local, model_dir):
    import ray
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(model_dir)  # shipped through the object store
    eng = RayEngine(module, local.tokenizer, workers=1, num_cpus_per_worker=0.5, max_retries=0, device="cpu",
                    start_timeout_s=240, timeout_s=120)
    same_batch(eng.generate(PROMPTS, 3, SP), local.generate(PROMPTS, 3, SP))  # one worker: the wrapped engine

    eng.timeout_s = 1e-3
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ray worker\(s\) \[0\] \(torch engine\) did not answer within"):
        eng.generate(PROMPTS, 64, RolloutSampling(max_new_tokens=64, seed=0))
    assert time.monotonic() - t0 < 10  # reported at the deadline, not after the work
    eng.timeout_s = 120
    same_batch(eng.generate(PROMPTS, 3, SP), local.generate(PROMPTS, 3, SP))  # the late worker was replaced
    assert eng.restarts == [1]

    ray.kill(eng._actors[0], no_restart=True)
    _wait_dead(eng._actors[0])
    with pytest.raises(RuntimeError, match=r"ray worker 0 \(torch engine\) died .*max_retries=0"):
        eng.generate(PROMPTS, 3, SP)  # no retries left: one error (the next call would start a fresh actor)

    eng.close()
    eng.close()
    assert ray.is_initialized()  # it joined the pool's cluster: closing it must not shut that down
    with pytest.raises(ValueError, match="closed"):
        eng.generate(PROMPTS, 2, SP)


@pytest.mark.ray
def test_owner_close_is_idempotent_and_shuts_down_its_cluster(pool):
    import ray

    actors = list(pool._actors)
    pool.close()
    pool.close()
    assert not ray.is_initialized()
    with pytest.raises(ValueError, match="closed"):
        pool.sync_weights(torch.nn.Linear(1, 1))
    assert actors and not pool._actors


def _wait_dead(actor, timeout_s: float = 30.0) -> None:
    """Block until a killed actor is reported dead (ray.kill is asynchronous: a call right after it may still run)."""
    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.info.remote(), timeout=timeout_s)
        except RayActorError:
            return
        time.sleep(0.2)
    pytest.fail(f"a killed actor still answered after {timeout_s} s")
