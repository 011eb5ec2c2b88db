"""Numbers a results page writes as prose, not yet through a template field, come from its results files.

Results pages (docs/results/*.md) and the README's headline block are rendered from the shipped files
(brorl_lab.study.render; tests/test_render.py holds each page to its render byte for byte). A number that enters a
page through a template field ``{{name}}`` is computed from the files by code. A number still written in a
template's prose (``brorl_lab/study/templates/*.md.tmpl``) is held here to the looser rule it had before
templating: it must equal a value of the page's files, or a value recomputed from them by the page's derivation
below, as the text rounds it. The page's ``<!-- results: ... -->`` comment (rendered from render.PAGES) names the
files; numbers that are not measurements (settings, a paper's claims) are declared in the template::

    <!-- not measured: 95% 80% (interval level and power); 41% 62% (BroRL's Table 2) -->

The test reads every *quoted number* of a template's prose (code spans, code blocks, link targets, comments and
fields left out): each decimal number (``0.27``, ``-1.46``, ``+27.9``, ``-1.25e+03``) and each percentage
(``46.1%``, ``53%``). ``x`` written with d decimals matches a value v when |s*v - x| <= 0.5e-d for a scale s of 1
or 100 (pass@1 as points or percent), signs included; ``a.bcde+NN`` matches 3 significant digits. A percentage
may also be a share written as a percentage of a value in [0, 1]. Every named file must be tracked by git and
carry a provenance record (command, commit, checkpoints, machine, wall time, date; ``brorl_lab.study.results``).
A template with no free number left (the flagship's, the README headline's) passes with nothing to check.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from brorl_lab.study.render import DRAFTS
from brorl_lab.study.results import PROVENANCE_KEYS, read_provenance

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (REPO / "docs" / "results").glob("*.md") if f"docs/results/{p.name}" not in DRAFTS)
RESULTS = re.compile(r"<!--\s*results:\s*(.*?)\s*-->", re.S)
NOT_MEASURED = re.compile(r"<!--\s*not measured:\s*(.*?)\s*-->", re.S)
# A number: an optional sign only where it cannot be a range's dash (not after a digit), digits with thousands
# commas, a decimal part and/or an exponent; or any of those followed by %.
NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(?<![\d])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(e[+\-]?\d+)?(%?)(?![\w])")
MIN_CHECKED = 10


# ---- reading a page ------------------------------------------------------------------------------------------------
def prose(text: str) -> str:
    """The page without what is not a quoted result: HTML comments, fenced code, inline code, link targets."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # [label](target): the target is a path, not a number
    text = re.sub(r"\{\{\s*\w+\s*\}\}", " ", text)  # a template field: a number computed by code
    return text


def quoted_numbers(text: str) -> list[tuple[str, float, int, bool, bool]]:
    """Every decimal number, number in e-notation and percentage of ``text`` as (as written, value, decimals,
    e-notation, percent). Integers without % (counts, steps, seeds: the design) are not results and are skipped."""
    out = []
    for m in NUMBER.finditer(text):
        sign, whole, frac, exp, pct = m.groups()
        if not (frac or exp or pct):
            continue
        written = m.group(0)
        value = float(whole.replace(",", "") + (frac or "") + (exp or ""))
        out.append((written, -value if sign in "-−" and sign else value, len(frac) - 1 if frac else 0, bool(exp),
                    bool(pct)))
    return out


def declared(text: str, pattern: re.Pattern) -> list[str]:
    return [tok for m in pattern.finditer(text) for tok in re.split(r"[\s,;]+", re.sub(r"\([^)]*\)", " ", m.group(1)))
            if tok]


# ---- the values a page may quote -------------------------------------------------------------------------------------
def leaves(obj) -> list[float]:
    """Every number in a JSON value (bools left out)."""
    if isinstance(obj, bool) or obj is None:
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)]
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in leaves(x)]
    if isinstance(obj, (list, tuple)):
        return [v for x in obj for v in leaves(x)]
    return []


def load(path: Path):
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def file_values(data) -> list[float]:
    if isinstance(data, pd.DataFrame):
        num = data.select_dtypes("number").to_numpy(float).ravel()
        return [float(v) for v in num if np.isfinite(v)]
    return leaves(data)


def derive_flagship(files: dict) -> list[float]:
    """What docs/results/flagship.md computes from the verdict: each arm's mean change of p on the rare side, the
    slopes' upper ends over the whole branch, and the seeds a 1-point gap needs at 80% power."""
    from brorl_lab.lab.stats import t_quantile

    v = files["notebooks/figures/flagship_verdict.json"]
    per = v["mechanism"]["per_seed"].values()
    out = [float(np.mean([r[a] for r in per])) for a in ("brorl", "prorl")]
    budget = v["gap_at_equal_samples"]["budget"]
    out += [s[k] * budget / s["per_samples"] for s in v["slopes"].values() for k in ("lo", "hi", "mean")]
    sd = 100 * v["gap_at_equal_samples"]["sd"]
    need = next(n for n in range(2, 200) if (t_quantile(0.975, n - 1) + t_quantile(0.8, n - 1)) * sd / math.sqrt(n)
                <= 1.0)
    return out + [float(need), sd]


def derive_regime(files: dict) -> list[float]:
    """What docs/results/regime_map.md counts and sums from the regime map's files: settings behind / not resolved
    at equal samples, the fits per axis and how many resolve the gap rising, collapsed seeds per arm, ProRL's
    generated samples over BroRL's, and the arms' training hours summed over runs."""
    t, s = files["notebooks/figures/regime_map.csv"], files["notebooks/figures/regime_seeds.csv"]
    out = [float((t["hi"] < 0).sum()), float(((t["lo"] <= 0) & (t["hi"] >= 0)).sum())]
    for rd in files["notebooks/figures/regime.json"].values():
        fits = pd.DataFrame(rd["fits"])
        out += [float(len(fits)), float((fits["b_lo"] > 0).sum())]
    out += [float(s["collapsed_prorl"].sum()), float(s["collapsed_brorl"].sum())]
    out += list(1 / t["generated_ratio"])
    hours = [s["wall_prorl"].sum() / 3600, s["wall_brorl"].sum() / 3600]
    return out + hours + [sum(hours)]


def derive_theorem(files: dict) -> list[float]:
    """The theorem page's ranges: per model and split, the smallest and largest mean of each metric over N."""
    s = files["notebooks/figures/theorem_on_the_model_summary.csv"]
    cols = [c for c in s.columns if c.startswith(("share_neg", "dq_per_lr", "n_dq_per_lr"))]
    g = s.groupby(["model", "split"])[cols]
    return list(g.min().to_numpy(float).ravel()) + list(g.max().to_numpy(float).ravel())


DERIVE = {"floor.md": derive_flagship, "regime_map.md": derive_regime,
          "theorem.md": derive_theorem}


def page_values(page: Path) -> tuple[list[float], list[str]]:
    """(values the page may quote, its result files) from its ``<!-- results: ... -->`` comment."""
    text = page.read_text()
    names = declared(text, RESULTS)
    files = {n: load(REPO / n) for n in names}
    values = [v for d in files.values() for v in file_values(d)]
    if page.name in DERIVE:
        values += DERIVE[page.name](files)
    return values, names


# ---- matching --------------------------------------------------------------------------------------------------------
def matches(number: tuple, values: list[float]) -> bool:
    """Whether ``number`` (from :func:`quoted_numbers`) is one of ``values`` as the text rounds it. A signed number
    (+0.93, -1.46) must have the value's sign; an unsigned one is a size ("lowered p by 0.46 points") and matches
    either sign."""
    written, x, decimals, sci, pct = number
    signed = written[0] in "+-−"
    vals = np.asarray(values, dtype=float)
    vals = vals if signed else np.abs(vals)
    if sci:
        return bool(np.any(np.isclose(vals, x, rtol=5.1e-3, atol=0)))
    tol = 0.5 * 10.0 ** -decimals + 1e-9
    return any(bool(np.any(np.abs(scale * vals - x) <= tol)) for scale in (1.0, 100.0))


def check_page(text: str, values: list[float]) -> tuple[list[str], int]:
    """(numbers of ``text`` that match no value, how many were checked), the page's declared non-measurements
    left out."""
    skip = set(declared(text, NOT_MEASURED))
    bad, checked = [], 0
    for num in quoted_numbers(prose(text)):
        if num[0].lstrip("+") in skip or num[0] in skip:
            continue
        checked += 1
        if not matches(num, values):
            bad.append(num[0])
    return bad, checked


def tracked() -> set[str]:
    return set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split())


# ---- the tests -------------------------------------------------------------------------------------------------------
def test_the_checker_reads_numbers_as_written_and_refuses_a_changed_one():
    text = ("gap -0.27 [-1.46, +0.93] points, 46.1% of 128 prompts, 8 seeds, N=512, 0.97-1.00, -1.25e+03 "
            "`--lr 3e-5` <!-- x 9.99 -->")
    nums = [n[0] for n in quoted_numbers(prose(text))]
    assert nums == ["-0.27", "-1.46", "+0.93", "46.1%", "0.97", "1.00", "-1.25e+03"]
    values = [-0.0027, -0.0146, 0.0093, 0.461, 0.97, 1.0, -1250.4]
    assert check_page(text, values) == ([], 7)
    assert check_page(text.replace("-0.27", "-0.28"), values)[0] == ["-0.28"]  # one digit off: caught
    assert check_page(text.replace("+0.93", "-0.93"), values)[0] == ["-0.93"]  # a flipped sign: caught
    assert check_page(text.replace("46.1%", "47%"), values)[0] == ["47%"]
    assert check_page(text + " <!-- not measured: 47% -->" + " 47%", values)[1] == 7  # declared: not checked


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_free_number_of_a_results_template_comes_from_its_page_files(page):
    """The page's files are tracked, carry provenance and are named in its text; each number its template still
    writes as prose (not a field) is a value of those files."""
    from brorl_lab.study.render import PAGES as RENDERED
    from brorl_lab.study.render import TEMPLATES

    values, names = page_values(page)
    assert names, f"{page.name}: no <!-- results: ... --> comment naming its files"
    missing = [n for n in names if n not in tracked()]
    assert not missing, f"{page.name}: results files not tracked by git: {missing}"
    for n in names:
        prov = read_provenance(REPO / n)
        absent = [k for k in PROVENANCE_KEYS if not prov.get(k)]
        assert not absent, f"{page.name}: {n}'s provenance record lacks {absent}"
    spec = next((s for s in RENDERED if s.path == f"docs/results/{page.name}"), None)
    assert spec is not None, f"{page.name}: no template renders it (brorl_lab.study.render.PAGES)"
    bad, checked = check_page((TEMPLATES / spec.template).read_text(), values)
    assert bad == [], f"{page.name}: template numbers found in none of {names} (nor derived from them): {bad}"


def headline_rows(readme: str) -> list[tuple[str, str]]:
    """(row text, the results page it links to) for each row of the README's headline table."""
    start = readme.index("<!-- headline -->")
    end = readme.index("<!-- /headline -->")
    rows = [line for line in readme[start:end].splitlines() if line.startswith("|") and "docs/results/" in line]
    return [(row, re.search(r"\((docs/results/[\w.]+\.md)[^)]*\)", row).group(1)) for row in rows]


BENCH = re.compile(r"<!--\s*bench:\s*(.*?)\s*-->", re.S)


def test_the_readme_speed_table_quotes_its_benchmark_files():
    """The README's speed block (between ``<!-- bench: files -->`` and ``<!-- /bench -->``) is held to the number
    rule against the benchmark JSON files it names, each tracked and carrying its command, commit and machine."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("<!-- bench:"):readme.index("<!-- /bench -->")]
    names = declared(block, BENCH)
    assert names and all(n in tracked() for n in names), names
    files = [load(REPO / n) for n in names]
    assert all(f.get("command") and f.get("machine") for f in files)
    bad, checked = check_page(block, [v for f in files for v in file_values(f)])
    assert checked >= 8 and bad == [], f"README speed block: {bad} in none of {names}"


def test_a_provenance_record_names_the_commit_and_hashes_the_checkpoint(tmp_path):
    from brorl_lab.core.paths import DEFAULT_MODEL_DIR
    from brorl_lab.study.results import provenance, provenance_path, write_provenance

    rec = provenance("python -m brorl_lab theorem", {"default": "default"}, 12.34)
    assert rec["checkpoints"]["default"]["path"] == "data/default_model"
    import hashlib

    assert rec["checkpoints"]["default"]["sha256"] == hashlib.sha256(
        (DEFAULT_MODEL_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert rec["commit"] != "unknown" and rec["wall_s"] == 12.3 and rec["machine"]["cpu_count"] >= 1
    out = write_provenance(tmp_path / "x.csv", rec)
    assert out == provenance_path(tmp_path / "x.csv") and read_provenance(tmp_path / "x.csv") == json.loads(
        out.read_text())
    with pytest.raises(ValueError, match="command"):
        provenance(" ", {}, 1.0)
    with pytest.raises(ValueError, match="missing"):
        write_provenance(tmp_path / "y.csv", {"command": "x"})


# ---- intervals recomputed here from the per-seed files, independently of the renderer ---------------------------------
def test_the_readme_headline_interval_is_recomputed_from_the_shipped_per_seed_file():
    """The README's first headline row: BroRL - ProRL at the budget of generated samples, recomputed here from the
    per-seed points alone (a paired t interval over seeds), must be the interval the row quotes."""
    from brorl_lab.lab.stats import paired_t_interval

    pts = pd.read_csv(REPO / "notebooks" / "figures" / "paid_learned_points.csv")
    last = pts[(pts["axis"] == "cum_samples") & (pts["mark"] == pts["mark"].max())]
    w = last.pivot_table(index="seed", columns="arm", values="value")
    r = paired_t_interval(w["brorl"].to_numpy(), w["prorl"].to_numpy())
    assert r["n"] >= 10
    quoted = f"{100 * r['mean']:+.2f} [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}] points"
    first_row = headline_rows((REPO / "README.md").read_text())[0][0]
    assert quoted in first_row, (quoted, first_row)


def test_every_regime_setting_interval_is_recomputed_from_the_shipped_per_seed_file():
    """The powered regime map: each setting's gap interval in the shipped table is the t interval over its paired
    seeds in the shipped per-seed file (gap = BroRL - ProRL per seed), every setting has at least 8 of them, and at
    least one reaches the rule's rho at the branch point."""
    from brorl_lab.lab.stats import t_interval
    from brorl_lab.study.regime import RHO_RULE

    seeds = pd.read_csv(REPO / "notebooks" / "figures" / "regime_seeds.csv")
    table = pd.read_csv(REPO / "notebooks" / "figures" / "regime_map.csv", index_col="setting")
    assert set(seeds["setting"]) == set(table.index) and (table["rho"] >= RHO_RULE).any()
    for name, g in seeds.groupby("setting"):
        r = t_interval((g["brorl"] - g["prorl"]).to_numpy(float))
        assert r["n"] >= 8 and r["n"] == table.loc[name, "n"], name
        assert np.allclose([r["mean"], r["lo"], r["hi"]], table.loc[name, ["gap", "lo", "hi"]].to_numpy(float)), name
