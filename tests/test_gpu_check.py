"""The prepared device check (bench/gpu_check.sh + .py) runs end to end in its CPU smoke variant and writes every
figure the GPU run reports, so the script cannot rot between GPU runs; the real shape is Qwen2-1.5B's."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402


def test_smoke_run_writes_every_figure(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "gpu_check_smoke.json"
    assert proc.stdout.strip().splitlines()[-1] == f"gpu_check JSON: {path}"
    d = json.loads(path.read_text())
    assert d["status"] == "ok" and d["skipped"] == [] and d["smoke"] is True
    s = d["settings"]
    assert s["ns"] == [16, 64, 256, 512] and s["total_samples"] == 512 and s["kernel"] == "shared_prefix"
    assert [r["n"] for r in d["rollout"]] == [16, 64, 256, 512]
    for r in d["rollout"]:
        assert r["prompts"] * r["n"] == r["samples"] == 512
        assert r["prompt_tokens"] == r["prompts"] * s["prompt_tokens"]  # each prompt is exactly prompt_tokens ids
        assert 0 < r["generated_tokens"] <= 512 * s["new_tokens"]
        assert r["samples_per_s"] == pytest.approx(512 / r["seconds"])
        assert r["tokens_per_s"] == pytest.approx(r["generated_tokens"] / r["seconds"])
        assert "peak_memory_gib" in r and r["peak_memory_gib"] is None  # CUDA-only figure; CPU reports RSS
    u = d["update"]
    assert u["n"] == 512 and u["samples"] == 512 and u["seconds"] > 0 and u["optimizer_steps"] == 1
    rollout_512 = d["rollout"][-1]
    assert u["tokens"] == 512 * rollout_512["prompt_tokens"] + rollout_512["generated_tokens"]  # prompt + response
    assert u["micro_batches"] >= math.ceil(u["tokens"] / s["micro_batch_tokens"]) >= 2  # the budget really split it
    assert all(math.isfinite(u["metrics"][k]) for k in ("loss", "kl", "entropy", "grad_norm"))
    assert "peak_memory_gib" in u and d["max_rss_gib"] > 0
    assert d["environment"]["torch_threads"] == 1
    for r in d["rollout"]:  # EOS ignored: every response is exactly new_tokens long
        assert r["generated_tokens"] == 512 * s["new_tokens"] and r["truncation_rate"] == 1.0


def test_smoke_run_writes_the_long_response_figures(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--smoke", "--ns", "16,512",
                           "--decode-graphs", "static"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "gpu_check_smoke.json").read_text())
    long, rollout = d["long"], {r["n"]: r for r in d["rollout"]}
    assert long["matmul_peak_tflops"] > 0 and [h["n"] for h in long["hf"]] == [16, 512]
    for h in long["hf"]:
        assert h["generated_tokens"] == 512 * d["settings"]["new_tokens"]  # the same fixed-length work as torch's
        assert long[f"torch_over_hf_n{h['n']}"] == pytest.approx(rollout[h["n"]]["samples_per_s"] / h["samples_per_s"])
    assert long["torch_samples_per_s_hi_over_lo"] == pytest.approx(rollout[512]["samples_per_s"] /
                                                                   rollout[16]["samples_per_s"])
    assert 0 < long["decode_mfu_pct"] < 100 and 0 < long["update_mfu_pct"] < 100
    prof = long["decode_profile"]
    assert prof["n"] == 512 and sum(prof["shares_pct"].values()) == pytest.approx(100)
    assert prof["bound_by"] == max(prof["shares_pct"], key=prof["shares_pct"].get)
    assert long["update_small"]["n"] == 16 and long["update_small"]["prompts"] == 1
    assert "update_peak_memory_hi_over_lo" not in long  # a CUDA-only figure (device memory)
    assert "long-response figures: matmul_peak_tflops" in proc.stdout and "decode bound by: " in proc.stdout
    graphs = long["graphs"]  # the static-shape (CUDA-graph) step, run eagerly here, against decode_graphs="off"
    assert graphs["mode"] == "static" and [e["n"] for e in graphs["eager"]] == [16, 512]
    for e in graphs["eager"]:
        assert e["graphs_over_eager"] == pytest.approx(rollout[e["n"]]["samples_per_s"] / e["samples_per_s"])
    for gap in (graphs["logprob_gap"], graphs["logprob_gap_eager"]):  # fp32: both equal the trainer's log-probs
        assert 0 <= gap["mean"] <= gap["max"] < 1e-4


def test_real_shape_is_qwen2_1_5b():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):  # counts parameters without allocating them
        model = Qwen2ForCausalLM(Qwen2Config(**gpu_check.SHAPES["qwen2-1.5b"]))
    params = sum(p.numel() for p in model.parameters())
    assert 1.50e9 < params < 1.58e9  # Qwen2-1.5B: 1.54B with tied embeddings


def test_tokenizer_gives_exact_prompt_lengths():
    tok = gpu_check.word_tokenizer(151936)
    ids = tok(gpu_check.random_prompts(4, 256, 151936, seed=0))["input_ids"]
    assert [len(x) for x in ids] == [256] * 4 and min(min(x) for x in ids) >= 3  # no special token inside
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    for args, word in [(["--ns", "7"], "--ns"), (["--ns", "a,b"], "--ns"), (["--new-tokens", "0"], "--new-tokens")]:
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--smoke", *args],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "OUT": str(tmp_path)})
        assert proc.returncode == 2 and word in proc.stderr
    assert not any(tmp_path.iterdir())
