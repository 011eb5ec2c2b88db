"""The benchmarks at ``--smoke`` size, so they cannot rot, plus the helpers they share. No speed is asserted:
benchmarks are not timed tests (the figures are ratios measured on a shared machine)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import common, run_all  # noqa: E402

FIGURES = {"hw", "rollout", "step", "memory", "theory", "long", "fusion"}
HAS_TRL = importlib.util.find_spec("trl") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None


# ---- the whole bench, smoke size, through the CLI --------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-m", "brorl_lab", "bench", "--smoke", "--json", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-4000:] + "\n" + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
@pytest.mark.vllm  # starts a real vllm(-cpu) engine when vllm is installed
@pytest.mark.timeout(1800)
def test_every_figure_has_finite_rows(smoke):
    data, _ = smoke
    assert set(data["figures"]) == FIGURES and data["errors"] == []
    assert data["args"]["smoke"] is True
    for name, fig in data["figures"].items():
        assert fig["rows"], name
        for r in fig["rows"]:
            assert r["group"] == name and r["figure"] and r["unit"], r
            assert isinstance(r["value"], float) and math.isfinite(r["value"]), r
            assert r["met"] in (True, False, None), r
    assert data["rows"] == [r for name in run_all.FIGURES for r in data["figures"][name]["rows"]]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_each_figure_has_its_comparisons(smoke):
    data, stdout = smoke
    names = {g: [r["figure"] for r in f["rows"]] for g, f in data["figures"].items()}
    assert any(n.startswith("rollout torch/hf N=") for n in names["rollout"])
    assert any(n.startswith("rollout torch/vllm N=") for n in names["rollout"]) == HAS_VLLM
    assert any("vllm engine start" in n for n in names["rollout"]) == HAS_VLLM
    assert any(n.startswith("fp32 matmul peak") for n in names["hw"])
    assert any(n.startswith("update") and n.endswith("MFU") for n in names["hw"])
    step = {r["figure"]: r for r in data["figures"]["step"]["rows"]}
    ratios = [r for n, r in step.items() if n.startswith("step time brorl_lab/TRL")]
    assert bool(ratios) == HAS_TRL
    assert any(n.startswith("step time brorl_lab-packed/TRL") for n in step) == HAS_TRL
    for r in ratios:  # the fairness record is part of the figure; both sides saw the same prompts
        assert "prompts identical: True" in r["fairness"] and r["note"] != "PROMPTS DIFFERED"
    assert any(n.startswith("update peak RSS N=") and "/" in n for n in names["memory"])
    assert len(names["theory"]) >= 3
    for text in ("machine:", "targets met:", "fairness [rollout]:", "figure", "met?", "== short responses",
                 "== long responses"):
        assert text in stdout
    m = data["machine"]
    assert m["torch_threads"] >= 1 and m["torch"] and m["cpu"] and isinstance(m["model"], dict)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_long_regime_has_every_figure(smoke):
    data, _ = smoke
    rows = {r["figure"]: r for r in data["figures"]["long"]["rows"]}
    engines = ["torch", "hf"] + (["vllm"] if HAS_VLLM else [])
    for n, P in ((4, 4), (16, 1)):  # smoke: 16 samples per call
        for e in engines:
            r = rows[f"long rollout {e} N={n} (P={P})"]
            assert r["unit"] == "samples/s" and r["point"] == {"regime": "long", "engine": e, "n": n}
            assert "every response 8 tokens: True" in r["note"]  # EOS ignored: fixed-length responses
            assert rows[f"long rollout {e} N={n} (P={P}) tokens"]["value"] == pytest.approx(8 * r["value"], rel=0.05)
        assert f"long rollout torch/hf N={n}" in rows
        assert (f"long rollout torch/vllm N={n}" in rows) == HAS_VLLM
    for e in engines:
        assert "1.98x" in rows[f"long rollout {e} samples/s N=16 / N=4"]["note"]
    mfu = rows["long decode (torch engine rollout) N=16 MFU"]
    assert mfu["note"].startswith("bounded by ")
    prefix = "long decode profile N=16: "
    shares = {name[len(prefix):]: r["value"] for name, r in rows.items() if name.startswith(prefix)}
    assert len(shares) >= 3 and sum(shares.values()) == pytest.approx(100, abs=0.01)
    assert mfu["note"].startswith(f"bounded by {max(shares, key=shares.get)} (")  # the largest profile row
    assert "long update peak RSS N=16 / N=4" in rows and "long update (ref fwd + policy fwd/bwd + AdamW) N=16 MFU" in rows
    assert ("long step time brorl_lab/TRL N=16 P=1" in rows) == HAS_TRL
    if HAS_TRL:
        assert "prompts identical: True" in rows["long step time brorl_lab/TRL N=16 P=1"]["fairness"]
        assert "fixed-length responses" in rows["long step time brorl_lab/TRL N=16 P=1"]["fairness"]
        # the roofline is a floor: no measured step beats it
        floor = rows["long step time brorl_lab/TRL N=16 at the roofline"]["value"]
        assert 0 < floor <= rows["long step time brorl_lab/TRL N=16 P=1"]["value"]
    assert rows["long memory bandwidth (copy 8 MiB, best)"]["value"] > 0
    assert 0 < rows["long decode torch engine speed / roofline N=16"]["value"] <= 100
    assert rows["long decode attention over the KV cache (profiled call) / its roofline N=16"]["value"] > 0
    for kind in ("transposed", "sdpa", "read"):  # decode attention alone: the engine's kernel and the candidates
        assert rows[f"long decode attention alone, engine / {kind} time"]["value"] > 0
    for kind in ("the engine's", "candidate sdpa"):
        assert rows[f"long decode attention alone, {kind} / copy bandwidth"]["unit"] == "% copy bw"
    assert float(rows["long decode attention alone, engine / sdpa time"]["note"].rsplit("by ", 1)[1]) < 1e-5
    assert rows["long rollout torch/hf N=16 at the roofline"]["value"] >= rows["long rollout torch/hf N=16"]["value"]
    short = [r["point"] for r in data["figures"]["rollout"]["rows"] if r.get("point")]
    assert {p["regime"] for p in short} == {"short"} and len(short) == len(engines) * 2
    assert [Path(p).name for p in data["plots"]][:1] == ["throughput_vs_n.html"]
    assert all(Path(p).stat().st_size > 1000 for p in data["plots"])


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_fusion_figure_times_both_steps_and_checks_equality(smoke):
    """The fused (torch.compile) decode step against the eager one: both timed, their ratio, the compile cost,
    and the numerical equality the fused path must keep (no speed asserted)."""
    data, _ = smoke
    rows = {r["figure"]: r for r in data["figures"]["fusion"]["rows"]}
    for what in ("decode N=8 (8 tokens)", "update N=4 (8 tokens)"):
        assert rows[f"fusion {what} eager"]["value"] > 0 and rows[f"fusion {what} fused"]["value"] > 0
        assert rows[f"fusion {what} fused/eager time"]["value"] > 0
        assert "interleaved pair" in rows[f"fusion {what} fused/eager time"]["fairness"]
    assert rows["fusion decode near-greedy tokens identical (6 tokens)"]["met"] is True
    assert rows["fusion decode |log-prob fused - eager| max"]["met"] is True
    assert rows["fusion update |log-prob fused - eager| max (trainer's recomputation)"]["met"] is True


# ---- the shared helpers (fast) ----------------------------------------------------------------------------------
def test_target_met_parses_the_targets_used():
    assert common.target_met(3.2, ">= 3") is True and common.target_met(2.9, ">= 3") is False
    assert common.target_met(0.4, "<= 0.5") is True and common.target_met(12.0, "< 10 ms") is False
    assert common.target_met(9.0, "< 10 ms") is True and common.target_met(1.0, None) is None
    assert common.target_met(float("nan"), ">= 3") is False and common.target_met(1.0, "about 2") is None


def test_row_and_table():
    r = common.row("g", "fig", 2, "x", target=">= 3", note="n")
    assert r["value"] == 2.0 and r["met"] is False
    assert common.row("g", "fig", 2, "x")["met"] is None
    table = common.format_table([r, common.row("g", "other", 1e7, "s", target="< 1")])
    assert "NO" in table and "1.000e+07" in table and table.splitlines()[0].startswith("figure")


def test_interleave_alternates_after_one_warmup_each():
    calls = []
    seconds, results = common.interleave({"a": lambda: calls.append("a") or 1,
                                          "b": lambda: calls.append("b") or 2}, repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert results == {"a": [1, 1, 1], "b": [2, 2, 2]} and all(len(v) == 3 for v in seconds.values())


@pytest.mark.parametrize("tie", [True, False])
def test_param_counts_split_body_and_head(tie):
    from helpers_models import tiny_qwen2

    model = tiny_qwen2(40, hidden=16, layers=1, heads=2, kv_heads=1, tie=tie)
    body, head = common.param_counts(model)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    assert head == 40 * 16 and body == total - 40 * 16 * (1 if tie else 2)
    assert common.forward_flops((body, head), 10, 3) == 2 * (10 * body + 3 * head)


def test_unknown_figure_is_exit_code_2(capsys):
    assert run_all.main(only=["rollout", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_throughput_figure_has_one_line_per_regime_and_engine():
    from brorl_lab.lab.plots import throughput_vs_n_figure

    points = [{"regime": r, "engine": e, "n": n, "samples_per_s": v}
              for r, v0 in (("short", 100.0), ("long", 5.0)) for e in ("torch", "hf")
              for n, v in ((16, v0), (512, 2 * v0))]
    fig = throughput_vs_n_figure(points)
    assert sorted(t.name for t in fig.data) == ["hf, long responses", "hf, short responses", "torch, long responses",
                                                "torch, short responses"]
    long_torch = next(t for t in fig.data if t.name == "torch, long responses")
    assert list(long_torch.x) == [16, 512] and list(long_torch.y) == [5.0, 10.0]
    assert fig.layout.xaxis.type == "log"
    with pytest.raises(ValueError, match="samples_per_s"):
        throughput_vs_n_figure([{"regime": "long", "engine": "torch", "n": 16}])


def test_profile_classes_name_the_decode_costs():
    from bench.bench_long import classify

    assert classify("aten::addmm") == "weight matmuls" and classify("aten::mm") == "weight matmuls"
    assert classify("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention over the KV cache"
    assert classify("aten::cat") == "KV and row copies" and classify("aten::multinomial") == "sampling"
    assert classify("aten::rsqrt").startswith("other ops")


def test_decode_roofline_counts_every_kv_read_and_flop():
    """The floor's two terms against a brute-force count: at fed token j each row reads its own j cached tokens
    and each prompt's prefix once; FLOPs are the prompts once plus every fed token."""
    from types import SimpleNamespace

    import torch

    from bench.bench_long import decode_roofline, kv_bytes_per_token, update_floor_seconds

    cfg = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=1, hidden_size=8, num_attention_heads=2)
    assert kv_bytes_per_token(cfg) == 2 * 2 * 1 * 4 * 4  # layers x (k, v) x KV heads x head_dim x fp32
    T, prompts = 3, [[5, 6], [7, 8, 9]]  # 2 prompts x 2 rows
    batch = SimpleNamespace(lengths=torch.full((4,), T), size=4, prompt_ids=prompts, num_prompts=2)
    reads = sum(4 * j + 5 for j in range(1, T))  # tokens read over the T - 1 fed steps
    counts = (100, 10)
    flops = common.forward_flops(counts, 5 + 4 * (T - 1), 2 + 4 * (T - 1))
    roof = decode_roofline(batch, cfg, counts, peak=1000.0, bandwidth=500.0)
    assert roof["kv_gb"] == pytest.approx(64 * reads / 1e9)
    assert roof["flop_seconds"] == pytest.approx(flops / 1000.0)
    assert roof["seconds"] == pytest.approx(flops / 1000.0 + 64 * reads / 500.0)
    assert update_floor_seconds(batch, counts, 1000.0) == pytest.approx(
        4 * common.forward_flops(counts, 5 + 4 * T, 4 * T) / 1000.0)


def test_plot_from_saved_runs_merges_their_points(tmp_path):
    rows = [common.row("rollout", "rollout torch N=16", 50.0, "samples/s", point={"regime": "short", "engine": "torch",
                                                                                  "n": 16}),
            common.row("long", "long rollout torch N=16", 5.0, "samples/s", point={"regime": "long", "engine": "torch",
                                                                                   "n": 16}),
            common.row("long", "long rollout torch/hf N=16", 1.2, "x")]
    (tmp_path / "a.json").write_text(json.dumps({"rows": rows[:1]}))
    (tmp_path / "b.json").write_text(json.dumps({"rows": rows[1:]}))
    out = tmp_path / "plots" / "x.json"
    assert run_all.cli(["--plot", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(out)]) == 0
    html = (out.parent / "throughput_vs_n.html").read_text()
    assert "torch, short responses" in html and "torch, long responses" in html
    (tmp_path / "c.json").write_text(json.dumps({"rows": rows[2:]}))
    assert run_all.cli(["--plot", str(tmp_path / "c.json"), "--json", str(out)]) == 2


def test_update_attention_bench_times_both_suffix_kernels():
    """bench_update_attention at a tiny size: the decoder-forced and rule updates at each budget, each timed."""
    from bench import bench_update_attention

    rows = bench_update_attention.run(rows=4, tokens=40, budgets=(256, 128), repeats=1, threads=1)
    assert len(rows) == 4 and all(r["value"] > 0 and r["unit"] == "s" for r in rows)
    assert sum("PrefixDecoder forced" in r["figure"] for r in rows) == 2


def test_update_profile_accounts_for_the_update_and_rates_its_matmuls():
    """--profile at a tiny size: the classes' shares cover the profiled wall time (outside ops is the rest, so they
    sum to 100%), the matmuls were counted (their FLOPs > 0) and their rate is a share of a measured peak."""
    from bench import bench_update_attention as U

    rows = U.profile_update(rows=4, tokens=40, budget=256, threads=1)
    shares = {r["figure"]: r["value"] for r in rows if r["unit"] == "% time"}
    assert abs(sum(shares.values()) - 100) < 1e-6 or sum(shares.values()) > 100  # outside ops clipped at 0
    assert shares["update profile: matmuls (weights, fwd and bwd)"] > 0
    own = next(r for r in rows if r["figure"] == "matmul ops' own rate / peak")
    assert 0 < own["value"] and "GFLOP" in own["note"]
    assert U.classify_update("aten::_foreach_addcdiv_") == "optimizer (AdamW)"
    assert U.classify_update("aten::mm") == "matmuls (weights, fwd and bwd)"
    assert U.classify_update("aten::_scaled_dot_product_flash_attention_for_cpu").startswith("attention")
    assert U.classify_update("aten::silu").startswith("elementwise")


def test_bench_json_records_the_command_without_the_machines_paths():
    from bench.run_all import command_line

    assert command_line(["checkout/brorl_lab/__main__.py", "bench", "--only", "long"]) == \
        "python -m brorl_lab bench --only long"
    assert command_line(["checkout/bench/run_all.py", "--smoke"]) == "python run_all.py --smoke"


def test_study_profile_shares_cover_each_run_and_the_shipped_run_is_read():
    """bench_study's accounting: the stages' CPU seconds and shares of one arm's run add up to its CPU time (the
    rest is "other", never negative by construction of the numbers below), and the full-size takeoff run's own step
    timings are read from its shipped metrics, each arm's shares summing to one."""
    from bench import bench_study as B

    res = {"startup": 5.0, "cpu": 40.0, "wall": 400.0, "times": {"rollout": 10.0, "refill_rollout": 6.0,
                                                                  "update": 12.0, "eval": 4.0, "checkpoint": 0.5}}
    s = B.shares(res)
    assert set(s["share"]) == set(B.STAGES) and abs(sum(s["share"].values()) - 1) < 1e-3
    assert s["cpu_seconds"]["other"] == 2.5 and s["wall_s"] == 400.0 and s["cpu_s"] == 40.0
    shipped = B.shipped_shares()
    for arm in ("prorl", "brorl"):
        assert abs(sum(shipped[arm]["share"].values()) - 1) < 1e-3 and shipped[arm]["total_s"] > 0
        assert shipped[arm]["seconds"]["rollout"] > 0 and shipped[arm]["seconds"]["update"] > 0


def test_suite_table_and_its_longest_first_schedule():
    """bench_suite: a --durations profile summed into conftest's units (a module fixture built on both workers of a
    profile counted once), and the longest-first schedule's makespan on two workers."""
    from bench import bench_suite as S

    text = ("== slowest durations ==\n300.00s setup    tests/test_book.py::test_a\n20.00s call     tests/test_book.py::test_a\n"
            "290.00s setup    tests/test_book.py::test_b\n5.00s call     tests/test_x.py::test_c\n"
            "0.50s teardown tests/test_x.py::test_c\n== 4 passed in 400.00s ==")
    profile, wall = S.parse_profile(text)
    assert wall == 400.0 and profile["tests/test_book.py::test_a"] == {"setup": 300.0, "call": 20.0}
    ids = ["tests/test_book.py::test_a", "tests/test_book.py::test_b", "tests/test_x.py::test_c",
           "tests/test_x.py::test_d"]
    table = S.unit_table(profile, wall, ids, lambda t: t.split("::")[0])
    assert table["units"]["tests/test_book.py"] == 320.0  # test_b's 290 s setup: the same fixture, counted once
    assert table["other_test_s"] == 5.5  # test_d: below the cut, at most the shortest listed test
    assert table["units"]["tests/test_x.py"] == 11.0
    makespan, plan = S.lpt({"a": 7, "b": 5, "c": 4, "d": 3, "e": 1}, workers=2)
    assert plan == [["a", "d"], ["b", "c", "e"]] and makespan == 10
    m = S.SUMMARY.match("1 failed, 1197 passed, 34 warnings, 5 errors in 850.98s (0:14:10)")  # `fresh` reads it
    assert m and m.group(2) == "850.98" and "5 errors" in m.group(1)
    with pytest.raises(SystemExit) as exit_:  # refused before anything is cloned, run or written
        S.main(["fresh", "--workers", "0"])
    assert exit_.value.code == 2


def test_units_split_a_module_but_keep_a_shared_fixture_together(monkeypatch):
    import conftest

    monkeypatch.setitem(conftest.SPLIT, "test_m", {"smoke": ("test_one", "test_two")})
    assert conftest.scope_of("tests/test_m.py::test_one") == conftest.scope_of("tests/test_m.py::test_two[x]") \
        == "tests/test_m.py::smoke"
    assert conftest.scope_of("tests/test_m.py::test_three[1]") == conftest.scope_of("tests/test_m.py::test_three[2]") \
        == "tests/test_m.py::test_three"
    assert conftest.scope_of("tests/test_other.py::test_three") == "tests/test_other.py"
    assert conftest.scope_of("tests/test_other.py::test_ray_runs") == "serial"
    # the modules whose notebooks the tiny book executes share its unit, so they share its session folder
    assert {conftest.scope_of(f"tests/{m}.py::test_x") for m in conftest.BOOK_UNIT} == {"tests/test_book.py"}
    assert conftest.unit_estimate({"units": {"u": 9.0}, "other_test_s": 0.5}, "u", 3) == 9.0
    assert conftest.unit_estimate({"units": {}, "other_test_s": 0.5}, "v", 3) == 1.5
