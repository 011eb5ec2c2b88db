"""Small-sample statistics for comparing runs over seeds: t intervals, the smallest detectable effect, OLS slopes.

With n paired seeds and per-seed differences d_1..d_n (mean d̄, sample sd s), the two-sided 95% interval of the
mean difference is

    d̄ ± t_{0.975, n-1} · s / sqrt(n)                     (t_interval, paired_t_interval)

and the smallest effects this design can see are

    MDE_95 = t_{0.975, n-1} · s / sqrt(n)                  (an observed gap this large has an interval excluding 0)
    MDE_80 = (t_{0.975, n-1} + t_{0.80, n-1}) · s / sqrt(n)  (a true gap this large is detected with 80% power)

t with n - 1 degrees of freedom, never the normal 1.96 (with 3 seeds t_{0.975, 2} = 4.30: "twice the s.e." is an
82% interval). :func:`ols_slope` fits y = a + b x by least squares, the per-run trend a slope test reads;
:func:`ols_slope_interval` adds the slope's t interval from one noisy curve (n points, n - 2 degrees of freedom):

    b ± t_{0.975, n-2} · s / sqrt(Σ (x_i - x̄)²),   s² = Σ (y_i - a - b x_i)² / (n - 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from brorl_lab.core.validation import is_number


def _values(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size and not np.isfinite(arr).all():
        raise ValueError(f"{name}: got non-finite values {arr[~np.isfinite(arr)][:3].tolist()}; allowed: finite "
                         "numbers")
    return arr


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile t_{q, df} (scipy.stats.t.ppf)."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


def t_interval(values: Sequence[float], *, level: float = 0.95, power: float = 0.8) -> dict:
    """Mean of ``values`` with its two-sided ``level`` t interval over n values (n - 1 degrees of freedom), and
    the smallest detectable effects (module docstring). Keys: n, mean, sd, se, t (the quantile used), lo, hi,
    excludes_zero, mde (= half-width: the smallest mean whose interval excludes 0) and mde_power (the effect
    detected with probability ``power``). With n < 2 the spread and interval are NaN."""
    if not (is_number(level) and 0 < level < 1) or not (is_number(power) and 0 < power < 1):
        raise ValueError(f"level, power: got {level!r}, {power!r}; allowed: probabilities in (0, 1)")
    x = _values("values", values)
    n = int(x.size)
    nan = float("nan")
    out = {"n": n, "mean": float(x.mean()) if n else nan, "sd": nan, "se": nan, "t": nan, "lo": nan, "hi": nan,
           "excludes_zero": False, "mde": nan, "mde_power": nan, "level": level, "power": power}
    if n < 2:
        return out
    sd = float(x.std(ddof=1))
    se = sd / math.sqrt(n)
    t = t_quantile(0.5 + level / 2, n - 1)
    half = t * se
    out.update(sd=sd, se=se, t=t, lo=out["mean"] - half, hi=out["mean"] + half, mde=half,
               mde_power=(t + t_quantile(power, n - 1)) * se)
    out["excludes_zero"] = bool(out["lo"] > 0 or out["hi"] < 0)
    return out


def paired_t_interval(a: Sequence[float], b: Sequence[float], **kw) -> dict:
    """:func:`t_interval` of the per-pair differences ``a - b`` (the same seeds in the same order)."""
    xa, xb = _values("a", a), _values("b", b)
    if xa.shape != xb.shape:
        raise ValueError(f"a, b: got {xa.size} and {xb.size} values; allowed: one value per pair in each")
    return t_interval(xa - xb, **kw)


def ols_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope b of y = a + b x (NaN with fewer than two distinct x)."""
    xs, ys = _values("x", x), _values("y", y)
    if xs.shape != ys.shape:
        raise ValueError(f"x, y: got {xs.size} and {ys.size} values; allowed: one y per x")
    if xs.size < 2 or np.ptp(xs) == 0:
        return float("nan")
    xc = xs - xs.mean()
    return float((xc * (ys - ys.mean())).sum() / (xc * xc).sum())


def ols_slope_interval(x: Sequence[float], y: Sequence[float], *, level: float = 0.95) -> dict:
    """Least-squares slope of y = a + b x with its two-sided ``level`` t interval (module docstring): keys n, slope,
    se, t (the quantile t_{(1+level)/2, n-2}), lo, hi, level. With fewer than 3 points or one distinct x the
    spread is NaN (no residual degree of freedom)."""
    if not (is_number(level) and 0 < level < 1):
        raise ValueError(f"level: got {level!r}; allowed: a probability in (0, 1)")
    xs, ys = _values("x", x), _values("y", y)
    b = ols_slope(xs, ys)
    n = int(xs.size)
    nan = float("nan")
    out = {"n": n, "slope": b, "se": nan, "t": nan, "lo": nan, "hi": nan, "level": level}
    if n < 3 or not math.isfinite(b):
        return out
    xc = xs - xs.mean()
    resid = ys - ys.mean() - b * xc  # [n]
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / float((xc * xc).sum()))
    t = t_quantile(0.5 + level / 2, n - 2)
    out.update(se=se, t=t, lo=b - t * se, hi=b + t * se)
    return out


def format_interval(r: dict, scale: float = 100.0, unit: str = "points") -> str:
    """``+1.2 [-0.3, +2.7] points (n=8, t=2.36; MDE 1.5, 80% power 2.2)`` from a :func:`t_interval` dict."""
    if r["n"] < 2:
        return f"{scale * r['mean']:+.2f} {unit} (n={r['n']}: no interval)"
    return (f"{scale * r['mean']:+.2f} [{scale * r['lo']:+.2f}, {scale * r['hi']:+.2f}] {unit} (n={r['n']}, "
            f"t={r['t']:.2f}; MDE {scale * r['mde']:.2f}, {100 * r.get('power', 0.8):.0f}% power {scale * r['mde_power']:.2f})")


def wilson_interval(successes, trials, *, level: float = 0.95) -> dict:
    """A share k/n with its Wilson score interval, always inside [0, 1] (the Wald k/n ± z·se leaves it near 0 and 1:
    "0.06 [-0.05, 0.18]"). With z the normal quantile of ``level`` and p̂ = k/n:

        centre = (p̂ + z²/2n) / (1 + z²/n),    half = z / (1 + z²/n) · sqrt(p̂(1-p̂)/n + z²/4n²)

    Keys: k, n, share (p̂), lo, hi, level. With n = 0 the share and interval are NaN (nothing was counted). The
    draws must be independent: shares of correlated units (samples of one prompt) get too narrow an interval."""
    if not (is_number(level) and 0 < level < 1):
        raise ValueError(f"level: got {level!r}; allowed: a probability in (0, 1)")
    if not (is_number(trials) and float(trials).is_integer() and trials >= 0):
        raise ValueError(f"trials: got {trials!r}; allowed: a whole number >= 0")
    if not (is_number(successes) and 0 <= successes <= trials and float(successes).is_integer()):
        raise ValueError(f"successes: got {successes!r}; allowed: a whole number in [0, trials={trials}]")
    k, n = int(successes), int(trials)
    nan = float("nan")
    if n == 0:
        return {"k": 0, "n": 0, "share": nan, "lo": nan, "hi": nan, "level": level}
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return {"k": k, "n": n, "share": p, "lo": max(0.0, centre - half), "hi": min(1.0, centre + half), "level": level}


def format_share(r: dict, digits: int = 2) -> str:
    """``0.06 [0.02, 0.17] (3 of 50)`` from a :func:`wilson_interval` dict; ``- (0 counted)`` when n = 0."""
    if r["n"] == 0:
        return "- (0 counted)"
    return f"{r['share']:.{digits}f} [{r['lo']:.{digits}f}, {r['hi']:.{digits}f}] ({r['k']} of {r['n']})"


def share_interval(successes: Sequence[float], trials: Sequence[float], *, level: float = 0.95, draws: int = 4000,
                   seed: int = 0) -> dict:
    """A share pooled over clusters, sum(k) / sum(n), with an interval inside [0, 1] that respects the clusters.

    ``successes`` [C] and ``trials`` [C] count per cluster (e.g. per seed: the prompts of one seed share one Adam
    step, so they are not independent draws). With two or more clusters the interval is the percentile cluster
    bootstrap (resample clusters with replacement, ``draws`` times; method "cluster bootstrap"); with one it is the
    :func:`wilson_interval` of its counts (method "wilson": units assumed independent). Clusters with n = 0 count
    nothing and are dropped. Keys: k, n, clusters, share, lo, hi, level, method."""
    k, n = _values("successes", successes), _values("trials", trials)
    if k.shape != n.shape or (k < 0).any() or (k > n).any():
        raise ValueError(f"successes, trials: got {k.tolist()[:5]}, {n.tolist()[:5]}; allowed: equal-length counts "
                         "with 0 <= successes <= trials")
    if not (is_number(level) and 0 < level < 1):
        raise ValueError(f"level: got {level!r}; allowed: a probability in (0, 1)")
    keep = n > 0
    k, n = k[keep], n[keep]
    if k.size < 2:
        r = wilson_interval(int(k.sum()), int(n.sum()), level=level)
        return {**r, "clusters": int(k.size), "method": "wilson"}
    pick = np.random.default_rng(seed).integers(0, k.size, size=(int(draws), k.size))  # [draws, C]
    boot = k[pick].sum(axis=1) / n[pick].sum(axis=1)  # [draws]
    lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
    return {"k": int(k.sum()), "n": int(n.sum()), "clusters": int(k.size), "share": float(k.sum() / n.sum()),
            "lo": float(lo), "hi": float(hi), "level": level, "method": "cluster bootstrap"}


def seeds_for_power(sd: float, effect: float, *, level: float = 0.95, power: float = 0.8, max_n: int = 10_000) -> int:
    """The fewest paired seeds n >= 2 whose design detects a true mean difference ``effect`` with probability
    ``power`` at two-sided ``level``, given the per-seed differences' sd (e.g. a pilot's):

        smallest n with (t_{(1+level)/2, n-1} + t_{power, n-1}) · sd / sqrt(n) <= effect    (MDE_80, module docstring)

    t with n - 1 degrees of freedom at every candidate n (the normal quantiles would give too few seeds: with
    sd = 1.19 points and effect 1 point, 12 by z, 14 by t; the flagship's 8-seed MDE_95 of 1.19 points implies
    sd = 1.42 and 18 seeds for 1 point)."""
    for name, v in (("sd", sd), ("effect", effect)):
        if not (is_number(v) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name}: got {v!r}; allowed: a finite number > 0")
    if not (is_number(level) and 0 < level < 1) or not (is_number(power) and 0 < power < 1):
        raise ValueError(f"level, power: got {level!r}, {power!r}; allowed: probabilities in (0, 1)")
    for n in range(2, max_n + 1):
        if (t_quantile(0.5 + level / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n) <= effect:
            return n
    raise ValueError(f"effect: {effect!r} needs more than max_n={max_n} seeds at sd={sd!r}")


def change_bound(values: Sequence[float], *, level: float = 0.95) -> dict:
    """An equivalence bound for a mean change: :func:`t_interval` of ``values`` (one change per seed) plus
    ``bound`` = max(|lo|, |hi|), the largest change in either direction the interval allows ("the arm changed
    held-out pass@1 by at most ``bound``"). NaN with fewer than 2 values."""
    r = t_interval(values, level=level)
    r["bound"] = max(abs(r["lo"]), abs(r["hi"])) if r["n"] >= 2 else float("nan")
    return r
