"""Theorem 1 on the model (brorl_lab.study.theorem): one update's per-prompt dQ_pos bookkeeping against Q_pos
recomputed from scratch, the first-order prediction at a tiny lr, resumability, summaries and the theory side."""

import numpy as np
import pandas as pd
import pytest
import torch

from brorl_lab.study import theorem as T


@pytest.fixture(scope="module")
def small():
    torch.set_num_threads(1)
    return T.setup("default", prompts=4, held_out=1, tasks=["gcd", "spell_backward"])


def _q_from_scratch(policy, st) -> np.ndarray:
    """Q_pos by a plain forward of prompt + candidate per row (no shared prefix, no logprobs module)."""
    b, out = st.cands.batch, np.zeros(st.cands.num_prompts)
    with torch.no_grad():
        for r in range(b.size):
            if not st.cands.weight[r]:
                continue
            p = r // b.n
            y = b.response_ids[r, :b.lengths[r]].tolist()
            ids = torch.tensor([b.prompt_ids[p] + y])
            logits = policy(input_ids=ids).logits[0].double() / st.cfg.temperature  # [L, V]
            lp = torch.log_softmax(logits, -1)[len(b.prompt_ids[p]) - 1:-1]  # rows predicting y
            out[p] += float(lp.gather(1, torch.tensor(y)[:, None]).sum().exp())
    return out


def test_dq_bookkeeping_equals_q_recomputed_from_scratch(small):
    policy, info = T.one_update(small, 8, seed=0)
    assert info["kept"].any(), "the update must have had at least one informative group"
    df = T.measure_update(small, 8, seed=0)
    before, after = _q_from_scratch(small.policy, small), _q_from_scratch(policy, small)
    np.testing.assert_allclose(df["q_before"], before, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(df["q_after"], after, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(df["dq"], after - before, atol=2e-6)
    assert df["dq"].abs().max() > 1e-3  # the update moved something
    assert list(df["split"]) == ["in_batch"] * 4 + ["held_out"] * 2
    assert (df.loc[df["split"] == "in_batch", "k"] >= 0).all()


def test_first_order_prediction_matches_at_a_tiny_lr():
    torch.set_num_threads(1)
    st = T.setup("default", prompts=4, held_out=1, tasks=["gcd", "spell_backward"], lr=1e-6)
    policy, info = T.one_update(st, 8, seed=0)
    measured = st.q_pos(policy) - st.q_before
    predicted = T.first_order_dq(st, policy)
    big = np.abs(predicted) > 1e-5
    assert big.sum() >= 2, predicted
    np.testing.assert_allclose(measured[big], predicted[big], rtol=0.05)
    # at the recipe's lr (300x larger) one Adam step is far from linear on some prompt
    st.cfg = st.cfg.replace(lr=3e-4)
    policy, _ = T.one_update(st, 8, seed=0)
    far = np.abs((st.q_pos(policy) - st.q_before) - T.first_order_dq(st, policy))
    assert far.max() > 10 * np.abs(measured - predicted).max()


def test_run_is_resumable_and_summarised_with_t_intervals(small, tmp_path):
    df = T.run_theorem("default", n_values=[4, 16], seeds=[0, 1], root=tmp_path, st=small, progress=False,
                       prompts=4, held_out=1)
    files = sorted(p.name for p in (tmp_path / "default_adamw").glob("n*_s*.csv"))
    assert files == ["n16_s0.csv", "n16_s1.csv", "n4_s0.csv", "n4_s1.csv"]
    again = T.run_theorem("default", n_values=[4, 16], seeds=[0, 1], root=tmp_path, st=small, progress=False,
                          prompts=4, held_out=1)
    pd.testing.assert_frame_equal(df.reset_index(drop=True), again.reset_index(drop=True), check_dtype=False)
    with pytest.raises(ValueError, match="other settings"):
        T.run_theorem("default", n_values=[4], seeds=[0], root=tmp_path, st=small, progress=False, prompts=4,
                      held_out=2)
    s = T.summarise_theorem(df)
    row = s[(s["n"] == 4) & (s["split"] == "in_batch")].iloc[0]
    per = T.per_seed(df)
    vals = per[(per["n"] == 4) & (per["split"] == "in_batch")]["dq_per_lr"].to_numpy()
    half = 12.706 * vals.std(ddof=1) / np.sqrt(2)  # t_{0.975, 1}: two seeds
    assert row["seeds"] == 2 and row["dq_per_lr_hi"] - row["dq_per_lr"] == pytest.approx(half, rel=1e-4)
    # a share is pooled over seeds, its interval (a cluster bootstrap over seeds) inside [0, 1]
    inb = df[(df["n"] == 4) & (df["split"] == "in_batch")]
    assert row["share_neg"] == pytest.approx((inb["dq"] < 0).mean())
    assert (s["share_neg_lo"] >= 0).all() and (s["share_neg_hi"] <= 1).all()
    assert (s["share_neg_lo"] <= s["share_neg"]).all() and (s["share_neg"] <= s["share_neg_hi"]).all()
    assert set(s["split"]) <= {"in_batch", "kept", "held_out"} and {"in_batch", "held_out"} <= set(s["split"])
    assert "| default | 4 | in-batch |" in T.theorem_table(s)


def test_theory_predictions_on_the_models_first_token(small):
    pred = T.theory_predictions(small, n_values=[4, 512], trials=50)
    assert set(pred["n"]) == {4, 512} and len(pred) == 2 * len(small.train_items)
    assert ((pred["p_neg"] >= 0) & (pred["p_neg"] <= 1)).all()
    assert (pred["q_pos_first"] > 0).all() and (pred["q_pos_first"] < 1).all()
    # Theorem 1's three terms add up to the exact expected total
    np.testing.assert_allclose(pred[["sampled_correct", "sampled_incorrect", "unsampled"]].sum(axis=1), pred["total"],
                               rtol=1e-6, atol=1e-12)
    th = T.theory_summary(pred)
    assert list(th["n"]) == [4, 512] and {"share_neg", "n_dq_per_lr"} <= set(th.columns)


def test_bad_input_is_named(small, tmp_path):
    with pytest.raises(ValueError, match="optimizer"):
        T.run_theorem("default", optimizer="adam", root=tmp_path, st=small)
    with pytest.raises(ValueError, match="n_values"):
        T.run_theorem("default", n_values=[1], root=tmp_path, st=small)
    with pytest.raises(ValueError, match="seeds"):
        T.run_theorem("default", seeds=[], root=tmp_path, st=small)


def test_the_shipped_reading_through_the_cli_and_the_function_agree_with_the_summary(capsys):
    """One reading (study.theorem.theorem_reading, from the per-seed rows): the CLI's `theorem --read` prints what
    reading_of_files gives, and its intervals are the shipped summary's (computed from the same rows)."""
    from brorl_lab.cli import main
    from brorl_lab.core.paths import NOTEBOOK_DIR

    shipped = NOTEBOOK_DIR / "figures"
    reading = T.reading_of_files(shipped)
    assert main(["theorem", "--read", str(shipped)]) == 0
    assert capsys.readouterr().out.strip() == T.reading_line(reading)
    s = pd.read_csv(shipped / f"{T.FIGURE_NAME}_summary.csv").set_index(["model", "n", "split"])
    for model, r in reading.items():
        row = s.loc[(model, r["n_hi"], "in_batch")]
        assert r["hi"] == pytest.approx(row[["dq_per_lr", "dq_per_lr_lo", "dq_per_lr_hi"]].tolist(), rel=1e-4)
    assert reading["plateau"]["trend"] == "rises with N"  # what docs/results/theorem.md reads from the same rows


def test_theorem_study_declares_first_and_the_cli_reads_what_it_read(tmp_path, capsys, monkeypatch):
    """A tiny study through the CLI: the declaration (naming its one reading) before the run, provenance with the
    run's start beside every file, and `--read` on its root and on its figure folder gives the study's reading."""
    import json

    from brorl_lab.cli import main
    from brorl_lab.study.results import SHIPPED_KEYS, read_provenance

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root, fig = tmp_path / "root", tmp_path / "fig"
    assert main(["theorem", "--models", "default", "--n-values", "4", "8", "--seeds", "2", "--prompts", "2",
                 "--held-out", "1", "--trials", "10", "--threads", "1", "--jobs", "1", "--root", str(root),
                 "--figure-dir", str(fig)]) == 0
    printed = capsys.readouterr().out
    decl = json.loads((root / "declaration.json").read_text())
    assert decl["reading"]["function"] == "brorl_lab.study.theorem.theorem_reading"
    assert decl["n_values"] == [4, 8] and decl["seeds"] == [0, 1]
    verdict = json.loads((root / "verdict.json").read_text())
    for folder in (root, fig):
        capsys.readouterr()
        assert main(["theorem", "--read", str(folder)]) == 0
        assert capsys.readouterr().out.strip() == T.reading_line(verdict["reading"])
    assert f"reading: {T.reading_line(verdict['reading'])}" in printed
    for path in (root / "per_seed.csv", fig / f"{T.FIGURE_NAME}_per_seed.csv"):
        record = read_provenance(path)
        assert set(SHIPPED_KEYS) <= set(record) and record["started_at"] <= record["date"]
        assert record["command"].startswith("python -m brorl_lab theorem")
        assert record["declaration"]["path"].endswith("declaration.json")
