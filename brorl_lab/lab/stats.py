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
