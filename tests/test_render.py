"""Results pages are rendered from the shipped files (brorl_lab.study.render, ``python -m brorl_lab render``).

Each shipped docs/results page, the README's headline block and every figure they show must equal its render byte
for byte; a per-seed value changed in a copy of the files must change the rendered page; a page is built only from
provenance records that pass the pre-registration rule (study.results.is_shippable) or are named in render.LEGACY;
and every shipped provenance record outside LEGACY holds the full rule (a clean commit, a start time, a declaration
committed before the run started).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from brorl_lab.study import render as R
from brorl_lab.study.results import SUFFIX, is_shippable

REPO = Path(__file__).resolve().parent.parent
FLAGSHIP = "docs/results/flagship.md"


@pytest.fixture(scope="module")
def rendered() -> dict[str, bytes]:
    return R.render()


def test_every_page_figure_and_the_readme_headline_equal_their_render(rendered):
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "results").glob("*.md")}
    design_drafts = set(R.DRAFTS)
    assert pages - design_drafts <= set(rendered), f"results pages no template renders: {pages - set(rendered)}"
    shown = {f"notebooks/figures/{m}" for p in pages - design_drafts
             for m in re.findall(r"notebooks/figures/([\w.]+\.png)", (REPO / p).read_text())}
    assert shown <= set(rendered) | set(R.FROZEN_FIGURES), shown - set(rendered)
    assert "notebooks/figures/headline.png" in (REPO / "README.md").read_text()
    assert R.differences(rendered) == [], "run `python -m brorl_lab render` and commit what it writes"


def test_figures_render_to_the_same_bytes_twice(rendered):
    again = R.headline_png(R.Files(REPO))
    assert again == rendered["notebooks/figures/headline.png"] and again[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"Software" not in again and b"Creation" not in again  # no software or date stamp in the PNG


def _copy_root(tmp_path: Path) -> Path:
    """A checkout's results files, README and the flagship's per-seed files (copied, so they can be changed)."""
    root = tmp_path / "root"
    for name in {*R.README_FILES, *(n for p in R.PAGES for n in p.files)}:
        for src in (REPO / name, REPO / (name + SUFFIX)):
            if src.exists():
                (root / src.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, root / src.relative_to(REPO))
    shutil.copy(REPO / "README.md", root / "README.md")
    return root


def test_a_changed_per_seed_value_changes_the_page_and_the_readme(tmp_path, rendered):
    root = _copy_root(tmp_path)
    points = root / "notebooks/figures/paid_learned_points.csv"
    df = pd.read_csv(points)
    last = (df["axis"] == "cum_samples") & (df["mark"] == df["mark"].max())
    row = df.index[last & (df["arm"] == "brorl") & (df["seed"] == 0)][0]
    df.loc[row, "value"] += 0.05  # one seed's held-out pass@1 at the budget, 5 points higher
    df.to_csv(points, index=False)
    out = R.render(root, only={FLAGSHIP, R.README})
    assert out[FLAGSHIP] != rendered[FLAGSHIP] and out[R.README] != rendered[R.README]
    changed = [a for a, b in zip(out[FLAGSHIP].decode().splitlines(), rendered[FLAGSHIP].decode().splitlines())
               if a != b]
    assert any(line.startswith("| 131,072 | 20 |") for line in changed), changed  # the table's last row moved
    assert "-0.63 [-1.09, -0.17]" not in out[FLAGSHIP].decode()  # the headline interval is no longer the shipped one


def test_a_template_field_without_a_value_or_a_value_without_a_field_is_refused():
    assert R.fill("gap {{gap}} points", {"gap": "-0.63"}) == "gap -0.63 points"
    with pytest.raises(R.RenderError, match=r"without a value \['gap'\]"):
        R.fill("gap {{gap}}", {})
    with pytest.raises(R.RenderError, match=r"without a field \['lo'\]"):
        R.fill("gap {{gap}}", {"gap": 1, "lo": 2})


def test_a_page_is_not_built_from_a_record_that_is_neither_shippable_nor_legacy(monkeypatch, capsys):
    from brorl_lab.cli import main

    monkeypatch.delitem(R.LEGACY, "notebooks/figures/paid_learned_points.csv")
    with pytest.raises(R.RenderError, match="paid_learned_points.csv cannot back a shipped page.*-dirty"):
        R.render(only={FLAGSHIP})
    assert main(["render", "--check"]) == 2  # the CLI: one line naming the file, exit 2, nothing written
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "paid_learned_points.csv" in err and "LEGACY" in err


def test_a_legacy_page_names_its_dirty_records_in_a_rendered_banner(rendered):
    text = rendered[FLAGSHIP].decode()
    banner = next(line for line in text.splitlines() if line.startswith("> **Legacy results.**"))
    for name in R.PAGES[0].files:
        dirty = "-dirty" in str(R.Files(REPO).provenance(name).get("commit"))
        assert (f"`{Path(name).name}`" in banner) == dirty, name


# ---- provenance: every shipped record ------------------------------------------------------------------------------------------
def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def shipped_records() -> dict[str, dict]:
    """{results file: its provenance record} for every tracked record: ``X.provenance.json`` beside X, or the
    ``provenance`` key of a shipped JSON results file."""
    out = {}
    for name in tracked():
        if name.endswith(SUFFIX):
            out[name[: -len(SUFFIX)]] = json.loads((REPO / name).read_text())
        elif name.endswith(".json") and name.startswith(("notebooks/figures/", "data/")):
            data = json.loads((REPO / name).read_text())
            if isinstance(data, dict) and isinstance(data.get("provenance"), dict):
                out.setdefault(name, data["provenance"])
    return out


def _utc(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_every_shipped_provenance_record_outside_legacy_is_preregistered():
    """A clean commit, a start time, and a declaration committed before the run's start (and an ancestor of the
    run's commit). Records that predate the rule are named, with why, in render.LEGACY; an exploratory pilot's record
    (``"status": "exploratory"``, its note saying what it sizes) is held only to this: the renderer refuses it."""
    records = shipped_records()
    assert len(records) >= 20
    for name, rec in records.items():
        if name in R.LEGACY:
            continue
        if rec.get("status") == "exploratory":  # a pilot that sizes a design (issue 43): free; no page is built from it
            assert is_shippable(rec), f"{name} is pre-registered: it is not exploratory"
            with pytest.raises(R.RenderError, match="cannot back a shipped page"):
                R.check_files(R.Files(REPO), (name,), "a results page")
            continue
        assert is_shippable(rec) == [], f"{name}: {is_shippable(rec)}"
        committed = subprocess.run(["git", "log", "-1", "--format=%cI", rec["declaration"]["commit"]], cwd=REPO,
                                   capture_output=True, text=True, check=True).stdout.strip()
        assert _utc(committed) <= _utc(rec["started_at"]), f"{name}: declaration committed after the run started"


def test_the_legacy_list_names_only_shipped_records_that_still_fail_the_rule():
    records = shipped_records()
    for name, why in R.LEGACY.items():
        assert (REPO / name).is_file() and name in records, f"LEGACY names {name}: no such shipped results file"
        assert is_shippable(records[name]), f"{name} now passes is_shippable: take it out of LEGACY"
        assert ("-dirty" in why) == str(records[name].get("commit", "")).endswith("-dirty"), name
    for name, why in R.FROZEN_FIGURES.items():
        assert (REPO / name).is_file() and why, name


def test_render_check_exits_1_naming_the_first_differing_line(rendered, monkeypatch, capsys):
    from brorl_lab.cli import main

    lines = rendered[FLAGSHIP].decode().splitlines(keepends=True)
    lines[9] = lines[9].replace("0", "1", 1) if "0" in lines[9] else "changed\n"
    edited = {FLAGSHIP: "".join(lines).encode()}
    assert R.differences(edited)[0].startswith(f"{FLAGSHIP}:10: shipped ")
    monkeypatch.setattr(R, "render", lambda: edited)
    assert main(["render", "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{FLAGSHIP}:10:") and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(R, "render", lambda: {FLAGSHIP: rendered[FLAGSHIP]})
    assert main(["render", "--check"]) == 0


def test_adopt_copies_a_clones_new_clean_results_and_overwrites_nothing(tmp_path, capsys):
    """`python -m brorl_lab adopt CLONE`: a study clone's new results files come over with their records when the
    record names a clean commit of this history and a declaration; a dirty or unknown commit and a record without a
    start are refused; a file here with other bytes is a conflict, left as it was; a copy stopped between the data
    and its record is finished by the next adopt; a file the clone's own commit holds is not its result."""
    from brorl_lab import cli
    from brorl_lab.study.results import adopt

    def git(*args, cwd):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    main = tmp_path / "main"
    (main / "notebooks/figures/s").mkdir(parents=True)
    (main / "notebooks/figures/s/old.csv").write_text("old\n")
    git("init", "-q", cwd=main)
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", "-A", cwd=main)
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x", cwd=main)
    head = git("rev-parse", "--short", "HEAD", cwd=main)
    git("clone", "-q", str(main), str(tmp_path / "clone"), cwd=tmp_path)
    ledger = tmp_path / "clone/notebooks/figures/s"
    record = {"command": "c", "checkpoints": {}, "machine": {}, "wall_s": 1.0, "date": "d", "started_at": "d",
              "declaration": {"path": "p", "commit": head}}
    files = {"good": head, "dirty": f"{head}-dirty", "stranger": "0123456", "clash": head, "half": head}
    for name, commit in files.items():
        (ledger / f"{name}_s0.csv").write_text(f"{name}\n")
        (ledger / f"{name}_s0.csv{SUFFIX}").write_text(json.dumps({**record, "commit": commit}))
    (ledger / "nostart_s0.csv").write_text("x\n")
    (ledger / f"nostart_s0.csv{SUFFIX}").write_text(json.dumps({k: v for k, v in record.items() if k != "started_at"}
                                                               | {"commit": head}))
    (main / "notebooks/figures/s/clash_s0.csv").write_text("mine\n")
    (main / "notebooks/figures/s/half_s0.csv").write_text("half\n")  # the data copied, its record not yet

    dry = adopt(tmp_path / "clone", main, dry_run=True)
    assert sorted(dry["adopted"]) == ["notebooks/figures/s/good_s0.csv", "notebooks/figures/s/half_s0.csv"]
    assert not (main / "notebooks/figures/s/good_s0.csv").exists()
    got = adopt(tmp_path / "clone", main)
    assert got["conflicts"] == ["notebooks/figures/s/clash_s0.csv"] and got["same"] == []
    assert sorted(r.split(":")[0] for r in got["refused"]) == [f"notebooks/figures/s/{n}_s0.csv"
                                                               for n in ("dirty", "nostart", "stranger")]
    assert "lacks ['started_at']" in next(r for r in got["refused"] if "nostart" in r)
    assert (main / "notebooks/figures/s/good_s0.csv").read_text() == "good\n"
    assert (main / f"notebooks/figures/s/half_s0.csv{SUFFIX}").is_file()
    assert (main / "notebooks/figures/s/clash_s0.csv").read_text() == "mine\n"  # nothing here overwritten
    assert not (main / "notebooks/figures/s/dirty_s0.csv").exists()
    again = adopt(tmp_path / "clone", main)
    assert again["adopted"] == [] and sorted(again["same"]) == ["notebooks/figures/s/good_s0.csv",
                                                                "notebooks/figures/s/half_s0.csv"]
    assert cli.main(["adopt", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().startswith("adopt: source: ")
