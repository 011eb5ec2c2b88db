"""brorl_lab.lab.stats.wilson_interval: shares with intervals inside [0, 1]."""

import numpy as np
import pytest

from brorl_lab.lab.stats import format_share, wilson_interval


def test_wilson_stays_inside_the_unit_interval_where_wald_does_not():
    r = wilson_interval(3, 50)  # Wald: 0.06 ± 1.96·sqrt(0.06·0.94/50) = [-0.006, 0.126]
    assert 0 < r["lo"] < 0.06 < r["hi"] < 0.2
    assert wilson_interval(0, 20)["lo"] == 0.0 and wilson_interval(0, 20)["hi"] > 0.1
    assert wilson_interval(20, 20)["hi"] == 1.0 and wilson_interval(20, 20)["lo"] < 0.9
    # the textbook value (Agresti & Coull): 95% Wilson interval of 1 of 10 is [0.0179, 0.4042]
    r = wilson_interval(1, 10)
    assert (r["lo"], r["hi"]) == pytest.approx((0.0179, 0.4042), abs=1e-4)
    assert format_share(r) == "0.10 [0.02, 0.40] (1 of 10)"


def test_wilson_covers_the_true_share():
    rng = np.random.default_rng(0)
    hits = [(lambda r: r["lo"] <= 0.05 <= r["hi"])(wilson_interval(int(k), 40)) for k in rng.binomial(40, 0.05, 2000)]
    assert 0.92 < np.mean(hits) < 0.99


def test_wilson_with_nothing_counted_and_bad_input():
    r = wilson_interval(0, 0)
    assert r["n"] == 0 and np.isnan(r["share"]) and format_share(r) == "- (0 counted)"
    for k, n in ((3, 2), (-1, 4), (1.5, 4), (1, float("nan"))):
        with pytest.raises(ValueError, match="successes|trials"):
            wilson_interval(k, n)
    with pytest.raises(ValueError, match="level"):
        wilson_interval(1, 2, level=1.5)


def test_share_interval_pools_clusters_and_stays_inside_the_unit_interval():
    from brorl_lab.lab.stats import share_interval

    r = share_interval([0, 1, 0, 2], [10, 10, 0, 10])  # the empty cluster counts nothing
    assert (r["k"], r["n"], r["clusters"], r["method"]) == (3, 30, 3, "cluster bootstrap")
    assert r["share"] == pytest.approx(0.1) and 0 <= r["lo"] <= 0.1 <= r["hi"] <= 1
    same = share_interval([5, 5, 5, 5], [10, 10, 10, 10])  # no spread between clusters: no width
    assert same["lo"] == same["hi"] == 0.5
    one = share_interval([3], [50])
    assert one["method"] == "wilson" and one["lo"] == pytest.approx(wilson_interval(3, 50)["lo"])
    assert share_interval([], [])["n"] == 0
    with pytest.raises(ValueError, match="successes, trials"):
        share_interval([3, 1], [2, 5])
