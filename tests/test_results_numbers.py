"""Results pages carry no hand-written measured number: every one enters through a template field.

Results pages (docs/results/*.md) and the README's headline block are rendered from the shipped files
(brorl_lab.study.render; tests/test_render.py holds each page to its render byte for byte). A template
(``brorl_lab/study/templates/*.md.tmpl``) names each number as a field ``{{name}}`` computed from the files by
code; what a template still writes as prose must be a declared non-measurement (a setting, a paper's claim)::

    <!-- not measured: 95% 80% (interval level and power); 41% 62% (BroRL's Table 2) -->

The number reader below finds every *quoted number* of a text (code spans, code blocks, link targets, comments and
fields left out): each decimal number (``0.27``, ``-1.46``, ``+27.9``, ``-1.25e+03``) and each percentage
(``46.1%``, ``53%``). The README's speed block is held to the older rule against its benchmark files: ``x`` written
with d decimals matches a value v when |s*v - x| <= 0.5e-d for a scale s of 1 or 100, signs included;
``a.bcde+NN`` matches 3 significant digits. Every results file a page names must be tracked by git and carry a
provenance record (command, commit, checkpoints, machine, wall time, date; ``brorl_lab.study.results``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from brorl_lab.study.render import DRAFTS
from brorl_lab.study.results import DECLARATION, PROVENANCE_KEYS, read_provenance

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (REPO / "docs" / "results").glob("*.md") if f"docs/results/{p.name}" not in DRAFTS)
RESULTS = re.compile(r"<!--\s*results:\s*(.*?)\s*-->", re.S)
NOT_MEASURED = re.compile(r"<!--\s*not measured:\s*(.*?)\s*-->", re.S)
# A number: an optional sign only where it cannot be a range's dash (not after a digit), digits with thousands
# commas, a decimal part and/or an exponent; or any of those followed by %.
NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(?<![\d])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(e[+\-]?\d+)?(%?)(?![\w])")


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
def test_a_results_page_is_rendered_from_tracked_files_and_its_template_writes_no_measured_number(page):
    """The page's files (its rendered ``<!-- results: -->`` comment) are tracked and carry provenance, a template
    renders it, and every measured number of that template enters through a field: what it writes as prose is
    only declared non-measurements (settings, a paper's claims)."""
    from brorl_lab.study.render import PAGES as RENDERED
    from brorl_lab.study.render import TEMPLATES

    names = declared(page.read_text(), RESULTS)
    assert names, f"{page.name}: no <!-- results: ... --> comment naming its files"
    missing = [n for n in names if n not in tracked()]
    assert not missing, f"{page.name}: results files not tracked by git: {missing}"
    for n in names:
        if Path(n).name == DECLARATION:
            continue  # a study's design, not a result (render.check_files skips it too); each run's record names it
        prov = read_provenance(REPO / n)
        absent = [k for k in PROVENANCE_KEYS if not prov.get(k)]
        assert not absent, f"{page.name}: {n}'s provenance record lacks {absent}"
    spec = next((s for s in RENDERED if s.path == f"docs/results/{page.name}"), None)
    assert spec is not None, f"{page.name}: no template renders it (brorl_lab.study.render.PAGES)"
    free, _ = check_page((TEMPLATES / spec.template).read_text(), [])
    assert free == [], f"{spec.template}: numbers written as prose, not through a field: {free}"


def test_the_readme_headline_template_writes_no_measured_number():
    from brorl_lab.study.render import TEMPLATES

    assert check_page((TEMPLATES / "readme_headline.md.tmpl").read_text(), [])[0] == []


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
    row = next(r[0] for r in headline_rows((REPO / "README.md").read_text()) if "N=512 revives" in r[0])
    assert quoted in row, (quoted, row)


def test_the_readme_frontier_row_is_recomputed_from_the_ledger_files():
    """Each README frontier row (one per branch point whose ratio runs are complete): every arm's gap to the leader
    at the budget, recomputed here from the ledger's per-run files alone (each run's first evaluation at or past the
    budget; a paired t interval over seeds), must be the interval the row quotes."""
    from brorl_lab.lab.stats import paired_t_interval

    decl = json.loads((REPO / "notebooks/figures/frontier/declaration.json").read_text())
    from brorl_lab.study.render import frontier_complete

    rows = [r[0] for r in headline_rows((REPO / "README.md").read_text()) if r[0].startswith("| which N wins")]
    assert len(rows) == len(frontier_complete())
    for row in rows:
        branch = re.search(r"from the (\w+) branch point", row)[1]
        budget = decl["budget"]["per_branch"][branch]
        metric = decl["evaluation"]["metric"]
        at = {}
        for path in sorted((REPO / "notebooks/figures/frontier/ratio").glob(f"{branch}-*_s*.parquet")):
            t = pd.read_parquet(path)
            hit = t[t[metric].notna() & (t["cum_samples"] >= budget)].sort_values("step").iloc[0]
            arm, seed = path.stem.rsplit("_s", 1)
            at.setdefault(arm.split("-", 1)[1], {})[int(seed)] = float(hit[metric])
        w = pd.DataFrame(at)
        leader = w.mean().idxmax()
        for other in (a for a in w.columns if a != leader):
            r = paired_t_interval(w[leader].to_numpy(), w[other].to_numpy())
            quoted = (f"N={leader[1:leader.index('x')]} - N={other[1:other.index('x')]}: {100 * r['mean']:+.2f} "
                      f"[{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}]")
            assert quoted in row, (quoted, row)



def test_the_readme_allocation_row_is_recomputed_from_both_ledgers():
    """Each README allocation row (one per branch point where the headline stage has all its runs): the allocation
    arm minus each uniform arm at the budget, recomputed here from the per-run files alone (the allocation ledger and
    the frontier's ratio ledger; each run's first evaluation at or past the budget; a paired t interval over seeds),
    must be the interval the row quotes."""
    from brorl_lab.lab.stats import paired_t_interval
    from brorl_lab.study.allocation import HEADLINE_STAGE

    decl = json.loads((REPO / "notebooks/figures/allocation/declaration.json").read_text())
    metric = decl["evaluation"]["metric"]
    rows = [r[0] for r in headline_rows((REPO / "README.md").read_text()) if "rollouts per prompt beats uniform" in r[0]]
    complete = [b for b in decl["branch_points"] if len(list((REPO / "notebooks/figures/allocation" / HEADLINE_STAGE)
                                                              .glob(f"{b}-*_s*.parquet"))) == len(decl["seeds"])]
    assert len(rows) == len(complete)

    def at_budget(path, budget):
        t = pd.read_parquet(path)
        return float(t[t[metric].notna() & (t["cum_samples"] >= budget)].sort_values("step").iloc[0][metric])

    for row in rows:
        branch = re.search(r"from the (\w+) branch point", row)[1]
        budget = decl["budget"]["per_branch"][branch]
        mine = {int(p.stem.rsplit("_s", 1)[1]): at_budget(p, budget)
                for p in (REPO / "notebooks/figures/allocation" / HEADLINE_STAGE).glob(f"{branch}-*_s*.parquet")}
        for arm in decl["shared_uniform_arms"]["arms"]:  # e.g. "n16x64": N = 16 rollouts x 64 prompts
            n = arm[1:arm.index("x")]
            other = {int(p.stem.rsplit("_s", 1)[1]): at_budget(p, budget) for p in
                     (REPO / "notebooks/figures/frontier/ratio").glob(f"{branch}-{arm}_s*.parquet")}
            seeds = sorted(set(mine) & set(other))
            r = paired_t_interval(np.array([mine[s] for s in seeds]), np.array([other[s] for s in seeds]))
            quoted = (f"{HEADLINE_STAGE} - N={n}: {100 * r['mean']:+.2f} [{100 * r['lo']:+.2f}, "
                      f"{100 * r['hi']:+.2f}]")
            assert quoted in row, (quoted, row)

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


def test_the_readme_race_row_is_recomputed_from_the_ledger_files():
    """The README's takeoff race row (once every takeoff ratio run is in the ledger; none before): each arm's
    restricted mean gap to N=16 in generated samples, recomputed here from the per-run files alone (per seed the
    first evaluation at least the declared level above step 0's, else the budget; a paired t interval), must be the
    interval the row quotes."""
    from brorl_lab.lab.stats import paired_t_interval
    from brorl_lab.study.render import frontier_complete

    decl = json.loads((REPO / "notebooks/figures/frontier/declaration.json").read_text())
    rows = [r[0] for r in headline_rows((REPO / "README.md").read_text()) if "the takeoff race from" in r[0]]
    assert len(rows) == ("takeoff" in frontier_complete())
    race, budget = decl["readings"]["race"], decl["budget"]["per_branch"]["takeoff"]
    metric = f"eval/{race['family']}/pass@1"
    times: dict[str, dict[int, float]] = {}
    for path in sorted((REPO / "notebooks/figures/frontier/ratio").glob("takeoff-*_s*.parquet")):
        t = pd.read_parquet(path).dropna(subset=[metric]).sort_values("step")
        hit = t[t[metric] >= t[metric].iloc[0] + race["level"]]
        arm, seed = path.stem.rsplit("_s", 1)
        times.setdefault(arm.split("-", 1)[1], {})[int(seed)] = min(float(hit["cum_samples"].iloc[0]) if len(hit)
                                                                     else budget, budget)
    for row in rows:
        w = pd.DataFrame(times)
        ref = min(w.columns, key=lambda a: int(a[1:a.index("x")]))
        for arm in (a for a in w.columns if a != ref):
            r = paired_t_interval(w[arm].to_numpy(), w[ref].to_numpy())
            quoted = f"N={arm[1:arm.index('x')]} - N={ref[1:ref.index('x')]}: {r['mean']:,.0f} [{r['lo']:,.0f}, {r['hi']:,.0f}]"
            assert quoted in row, (quoted, row)
