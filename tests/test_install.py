"""Install beyond a checkout: the wheel carries data/ as brorl_lab/_data, the notebook stack is the `lab` extra, and
a wheel installed without -e runs `python -m brorl_lab eval --model default` away from the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from brorl_lab.core import paths

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LAB_STACK = {"jupyterlab", "ipywidgets", "anywidget", "plotly", "papermill", "ipykernel", "nbconvert", "kaleido",
             "jupytext"}
SHIPPED = ["default_model/config.json", "default_model/model.safetensors", "default_model/tokenizer.json",
           "plateau_model/config.json", "plateau_model/model.safetensors", "eval/chain_sum.jsonl",
           "eval/simple_equations.jsonl"]


def _name(req: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(req).name.lower()


def test_pyproject_packages_every_subpackage_and_maps_data_into_the_wheel():
    st = PYPROJECT["tool"]["setuptools"]
    code = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "brorl_lab").rglob("__init__.py")}
    data = {f"brorl_lab._data.{d.name}" for d in (ROOT / "data").iterdir() if d.is_dir()}
    assert set(st["packages"]) == code | data, "a new subpackage must be listed in [tool.setuptools] packages"
    assert st["package-dir"] == {"brorl_lab._data": "data"}
    assert all(f"brorl_lab._data.{d.split('/')[0]}" in st["package-data"] for d in SHIPPED)


def test_the_notebook_stack_is_the_lab_extra_not_a_dependency():
    deps = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert LAB_STACK <= {_name(r) for r in extras["lab"]}
    assert not deps & LAB_STACK and not {_name(r) for r in extras["ray"]} & LAB_STACK
    assert "datasets" in deps  # local:<file> tasks
    assert "lab" in (ROOT / "Makefile").read_text().split("-e '.[")[1].split("]")[0].split(",")


def test_a_checkout_finds_its_data_dir_and_the_cache_follows_the_environment(tmp_path, monkeypatch):
    if not (ROOT / "brorl_lab" / "_data").exists():  # a checkout: data/ at the top, runs/ beside it
        assert paths.DATA_DIR == ROOT / "data" and paths.IN_CHECKOUT and paths.RUNS_DIR == ROOT / "runs"
    assert (paths.DEFAULT_MODEL_DIR / "config.json").is_file() and (paths.EVAL_DIR / "gcd.jsonl").is_file()
    monkeypatch.setenv("BRORL_LAB_CACHE", str(tmp_path / "c"))
    assert paths.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("BRORL_LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "brorl_lab"


@pytest.mark.slow
def test_a_wheel_installed_without_the_checkout_runs_eval_default(tmp_path):
    """Build the wheel offline from a copy of the sources, install it (no -e) into a fresh venv whose only link to
    the dev environment is a .pth line adding its site-packages (dependencies only: a .pth path line does not run
    the dev venv's editable finder), and run `python -m brorl_lab eval --model default` from an empty directory."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("brorl_lab", "data"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "_data"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("brorl_lab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"brorl_lab/_data/{f}" for f in SHIPPED} <= names
    assert {"brorl_lab/rollout/tasks/user.py", "brorl_lab/cli.py"} <= names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               BRORL_LAB_CACHE=str(tmp_path / "cache"))
    where = subprocess.run([str(py), "-c", "import json, sys, brorl_lab, brorl_lab.core.paths as p; print(json.dumps("
                            "{'file': brorl_lab.__file__, 'data': str(p.DATA_DIR), 'runs': str(p.RUNS_DIR), 'path': sys.path}))"],
                           cwd=work, env=env, check=True, capture_output=True, text=True)
    info = json.loads(where.stdout)
    assert Path(info["file"]).is_relative_to(site) and Path(info["data"]) == site / "brorl_lab" / "_data"
    assert not any(p and Path(p).resolve() == ROOT for p in info["path"]), "the checkout is on sys.path"
    assert info["runs"] == "runs"  # experiments write under the working directory, never into site-packages

    out = subprocess.run([str(py), "-X", "importtime", "-m", "brorl_lab", "eval", "--model", "default",
                          "--tasks", "chain_sum", "--prompts", "4", "--samples", "2", "--k", "1",
                          "--max-new-tokens", "4", "--json", str(work / "m.json")],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "chain_sum" in out.stdout and json.loads((work / "m.json").read_text())["eval/chain_sum/pass@1"] >= 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "brorl_lab" in imported and not imported & LAB_STACK, imported & LAB_STACK  # eval needs no notebook stack
