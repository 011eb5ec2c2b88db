"""Compose override lines with verl's own packaged Hydra config (``verl/trainer/config/ppo_trainer.yaml``), as
``verl.trainer.main_ppo`` does at start, and read back the values the keys resolved to.

    values = compose_verl(read_overrides("out/overrides.txt"), keys=["actor_rollout_ref.rollout.n"],
                          env={"BRORL_VERL_DIR": "out"})
    values["actor_rollout_ref.rollout.n"]   # 16; a key verl's config lacks raises VerlComposeError (Hydra's message)

It runs in a child process: verl 0.9.1's config needs hydra-core 1.3 (1.4 refuses its ``../optim`` defaults), whose
grammar needs antlr4-python3-runtime 4.9, while math-verify here pins 4.13. ``make env`` installs hydra-core 1.3.8,
omegaconf 2.3.0 and antlr4 4.9.3 into ``.venv/verl-hydra`` (``$BRORL_VERL_HYDRA`` to move it), which the child puts
first on its path; a machine with verl's own environment needs none of that (the child then uses what it finds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

HYDRA_ENV = "BRORL_VERL_HYDRA"

# The child: imports only hydra and omegaconf (find_spec locates verl's config without importing verl).
_CHILD = r"""
import importlib.util, json, os, sys
req = json.load(sys.stdin)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import hydra, omegaconf
spec = importlib.util.find_spec("verl")
if spec is None:
    print(json.dumps({"error": "verl is not installed"})); sys.exit(0)
config_dir = os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")
try:
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=req["overrides"])
    out = {}
    for key in req["keys"]:
        node = OmegaConf.select(cfg, key, throw_on_missing=True)
        out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"})); sys.exit(0)
print(json.dumps({"values": out, "hydra": hydra.__version__, "omegaconf": omegaconf.__version__,
                  "config_dir": config_dir}))
"""


class VerlComposeError(ValueError):
    """verl's Hydra config refused the overrides (an unknown key, a bad value); the message is Hydra's."""


def hydra_path() -> Optional[Path]:
    """Where the hydra-core 1.3 side install lives (see module doc), or None when there is none."""
    p = Path(os.environ.get(HYDRA_ENV) or Path(sys.prefix) / "verl-hydra")
    return p if p.is_dir() else None


def compose_verl(overrides: Sequence[str], keys: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                 timeout: float = 300) -> dict[str, Any]:
    """``{key: resolved value}`` for ``keys`` after composing verl's ``ppo_trainer`` config with ``overrides``
    (Hydra override lines); ``env`` is added to the child's environment (``${oc.env:...}`` in the overrides)."""
    child_env = {**os.environ, **(env or {})}
    side = hydra_path()
    if side is not None:
        child_env["PYTHONPATH"] = os.pathsep.join([str(side), child_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps({"overrides": list(overrides),
                                                                            "keys": list(keys)}),
                          capture_output=True, text=True, env=child_env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise VerlComposeError(f"composing verl's config failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    res = json.loads(lines[-1])
    if "error" in res:
        raise VerlComposeError(res["error"])
    return res["values"]


def check_launch(out: str | Path) -> str:
    """Compose ``out/overrides.txt`` (what ``launch --to verl`` wrote) with verl's config and check that every key
    exists and resolves to the value ``out/launch.json`` says was meant (paths under ``out``); a one-line summary,
    or a VerlComposeError naming each mismatch."""
    out = Path(out).resolve()
    meant = json.loads((out / "launch.json").read_text())
    env = {meant["data_dir_env"]: str(out)}
    marker = "${oc.env:" + meant["data_dir_env"] + "}"
    lines = [ln for ln in (out / "overrides.txt").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    want = {k: v.replace(marker, str(out)) if isinstance(v, str) else v for k, v in meant["overrides"].items()}
    got = compose_verl(lines, list(want), env=env)
    bad = [f"{k}: meant {want[k]!r}, verl has {got.get(k)!r}" for k in want if got.get(k) != want[k]]
    if bad:
        raise VerlComposeError("verl's config does not hold what launch meant: " + "; ".join(bad))
    from brorl_lab.lab.verl_launch import portability_problems

    moved = portability_problems(out)
    if moved:
        raise VerlComposeError(f"{out} would not work copied elsewhere: " + "; ".join(moved))
    return f"checked: all {len(want)} overrides resolve in verl's own config to the values meant ({out / 'overrides.txt'})"
