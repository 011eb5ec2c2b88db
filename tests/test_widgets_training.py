"""The live training dashboard and the run browser, driven by real (tiny) Trainer runs."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
from helpers_runs import make_tiny_runs, tiny_config

from brorl_lab.lab import tracking
from brorl_lab.lab.widgets import DASHBOARD_STOP_LABEL, TrainingDashboard, TrainingJob, run_browser
from brorl_lab.rl.trainer import Trainer

METRICS = ("reward_mean", "entropy", "kl", "eval/mean/pass@1")


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def finite_points(df: pd.DataFrame, metric: str, x: str = "step") -> tuple[list, list]:
    d = df[[x, metric]].dropna() if metric in df else df.iloc[:0][[x]]
    return d[x].tolist(), (d[metric].tolist() if metric in d else [])


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_tiny_runs(root)
    return root


def test_dashboard_traces_follow_a_real_run_and_mark_resets(tmp_path):
    dash = TrainingDashboard(metrics=METRICS)
    assert all(len(f.data[0].x) == 0 for f in dash.figures.values())
    assert dash.stop_button.disabled  # nothing to stop before a trainer calls in
    with Trainer(tiny_config(tmp_path, "live", steps=3, eval_every=2, kl_beta=0.05, reset_every=2),
                 callbacks=[dash], progress=False) as t:
        metrics = t.run()
    # the last rows of a fast run are coalesced; the timer draws them within min_interval_s
    wait_for(lambda: len(dash.figures["reward_mean"].data[0].x) == 3, 5 * dash.min_interval_s + 5)
    assert dash.trainer is t and not dash.stop_button.disabled
    assert len(dash.rows) == len(metrics) == 4  # step-0 eval row + 3 steps
    for m in METRICS:
        line, resets = dash.figures[m].data
        xs, ys = finite_points(metrics, m)
        assert list(line.x) == xs and np.allclose(line.y, ys), m
        assert list(resets.x) == [2], m  # reset_every=2 over 3 steps: one reset, at step 2
        assert "every 2 steps" in resets.hovertext[0]  # the reason, read from events.jsonl
    assert list(dash.figures["eval/mean/pass@1"].data[0].x) == [0, 2, 3]  # eval rows only
    assert "step 3" in dash.status.value


def test_dashboard_update_appends_and_a_new_trainer_replays_its_rows(tmp_path):
    dash = TrainingDashboard(metrics=("reward_mean", "kl"), x="cum_samples", min_interval_s=0)  # draw every row
    assert dash.update({"step": 1, "cum_samples": 16, "reward_mean": 0.25, "kl": float("nan")}) == 1
    assert dash.update({"step": 2, "cum_samples": 32, "reward_mean": 0.5, "kl": 0.1, "reset": True}) == 2
    line, resets = dash.figures["reward_mean"].data
    assert list(line.x) == [16, 32] and list(line.y) == [0.25, 0.5]
    assert list(resets.x) == [32] and list(resets.y) == [0.5]
    kl_line, kl_resets = dash.figures["kl"].data
    assert list(kl_line.x) == [32]  # the NaN KL of step 1 is not drawn
    with Trainer(tiny_config(tmp_path, "replay", steps=1, eval_every=0), progress=False) as t:
        t.run()
        dash(t, t.rows[-1])  # first call from a trainer: clear, then replay all of its rows
    assert dash.trainer is t and len(dash.rows) == len(t.rows) == 1
    assert list(dash.figures["reward_mean"].data[0].x) == [t.rows[0]["cum_samples"]]
    assert len(dash.figures["reward_mean"].data[1].x) == 0
    with pytest.raises(ValueError, match="x: got 'epoch'"):
        TrainingDashboard(x="epoch")


def test_fast_rows_are_coalesced_into_few_redraws_and_none_is_lost():
    dash = TrainingDashboard(metrics=("reward_mean",), min_interval_s=0.4)
    drawn_now = [dash.update({"step": i, "reward_mean": i / 10}) for i in range(1, 11)]
    assert drawn_now[0] == 1 and sum(drawn_now[1:]) == 0  # the first row draws at once, the rest wait
    assert list(dash.figures["reward_mean"].data[0].x) == [1]
    wait_for(lambda: len(dash.figures["reward_mean"].data[0].x) == 10, 5)  # the timer flushed them in one go
    assert list(dash.figures["reward_mean"].data[0].y) == pytest.approx([i / 10 for i in range(1, 11)])
    assert "step 10" in dash.status.value


def test_stop_button_stops_a_background_run_after_the_current_step_and_it_resumes(tmp_path):
    dash = TrainingDashboard(metrics=("reward_mean",))
    reached, clicked = threading.Event(), threading.Event()

    def at_step_one(trainer, row):  # runs in the training thread, inside step 1's callbacks
        if row.get("step") == 1:
            reached.set()
            assert clicked.wait(60), "the main thread never clicked Stop"

    t = Trainer(tiny_config(tmp_path, "stopped", steps=4, eval_every=0), callbacks=[at_step_one], progress=False)
    try:
        job = dash.start(t)  # appends the dashboard as a callback, trains in a thread
        assert reached.wait(120), "step 1 never finished"
        assert not job.done
        dash.stop_button.click()  # from the main thread while the run is mid-step, as a user's click arrives
        assert dash.stop_requested and dash.stop_button.disabled
        clicked.set()
        metrics = job.result(timeout=120)
    finally:
        t.close()
    assert t.step_idx == 1 and metrics["step"].tolist() == [1]  # finished step 1, did not start step 2
    run = tracking.RunDir(t.run_dir.path)
    assert run.read_status()["status"] == "interrupted"
    assert [e["event"] for e in run.read_events()][-1] == "interrupted"
    with Trainer.resume(t.run_dir.path, progress=False, callbacks=[dash]) as resumed:
        assert resumed.step_idx == 1
        full = resumed.run()
    assert full["step"].tolist() == [1, 2, 3, 4]
    wait_for(lambda: len(dash.figures["reward_mean"].data[0].x) == 4, 5)
    assert list(dash.figures["reward_mean"].data[0].x) == [1, 2, 3, 4]  # history replayed, then extended
    assert dash.stop_button.description == DASHBOARD_STOP_LABEL and not dash.stop_button.disabled


def test_training_job_turns_a_kernel_interrupt_into_on_interrupt():
    stop = threading.Event()
    job = TrainingJob(lambda: stop.wait(30) and "stopped cleanly", on_interrupt=stop.set)
    main = threading.main_thread()

    def waiting_in_result() -> bool:  # the main thread blocks in Event.wait called from TrainingJob.result
        frame = sys._current_frames().get(main.ident)
        if frame is None or frame.f_code.co_name != "wait":
            return False
        while frame is not None:
            if frame.f_code is TrainingJob.result.__code__:
                return True
            frame = frame.f_back
        return False

    def interrupt_once_waiting():  # a fixed delay raced a loaded machine: the signal came before result() waited
        deadline = time.monotonic() + 30
        while not waiting_in_result() and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # what the kernel's ■ button sends

    # A kernel turns SIGINT into KeyboardInterrupt; an earlier test in this process (an engine, a Trainer) may have
    # left another SIGINT handler installed, under which the signal would never reach result().
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        killer = threading.Thread(target=interrupt_once_waiting, daemon=True)
        killer.start()
        assert job.result(timeout=30) == "stopped cleanly"
        killer.join(5)
    finally:
        signal.signal(signal.SIGINT, previous)
    failing = TrainingJob(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=30)


def test_run_browser_overlays_the_selected_runs(runs_root):
    browser = run_browser(runs_root)
    assert set(browser.run_select.options) == {"n4", "n8", "partial"}  # the index lists the metric-less run too
    assert browser.metric.value == "eval/mean/pass@1"
    assert {"reward_mean", "entropy", "eval/gcd/pass@4"} <= set(browser.metric.options)
    data = tracking.load_runs(runs_root)

    browser.run_select.value = ("n4", "n8")
    browser.metric.value = "reward_mean"
    browser.x_axis.value = "cum_samples"
    lines = {tr.name: tr for tr in browser.figure.data if "resets" not in tr.name}
    assert set(lines) == {"n4", "n8"}
    for name, tr in lines.items():
        xs, ys = finite_points(data[data["run"] == name], "reward_mean", "cum_samples")
        assert list(tr.x) == xs and np.allclose(tr.y, ys)
    assert lines["n8"].x[-1] == 2 * lines["n4"].x[-1]  # N=8 generates twice the samples per step
    resets = [tr for tr in browser.figure.data if "resets" in tr.name]
    assert [tr.name for tr in resets] == ["n4 · resets"] and list(resets[0].x) == lines["n4"].x.tolist()

    browser.run_select.value = ("n8",)
    assert [tr.name for tr in browser.figure.data] == ["n8"]
    assert "n8" in browser.table.value and "finished" in browser.table.value


def test_run_browser_on_an_empty_root_says_so_and_refresh_finds_new_runs(tmp_path):
    browser = run_browser(tmp_path / "nothing_yet")
    assert "No runs under" in browser.message.value
    assert browser.figure.layout.annotations[0].text.startswith("no runs")
    assert not (tmp_path / "nothing_yet").exists()  # browsing never creates directories
    with Trainer(tiny_config(tmp_path / "nothing_yet", "late", steps=1, eval_every=0), progress=False) as t:
        t.run()
    browser.refresh()
    assert browser.run_select.options == ("late",) and browser.selected == ("late",)
    assert [tr.name for tr in browser.figure.data] == ["late"]
    assert not browser.figure.layout.annotations  # the "no runs" message is gone
