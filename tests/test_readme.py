"""The README's code runs as written: every ```python block of README.md (and the package docstring's example), in
order, in one fresh interpreter, as a reader pasting them into a notebook would. A block that cannot run on this
machine says so right above it with ``<!-- not run: why -->``; the test counts those and runs every other one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import brorl_lab

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*\n)?```python\n(.*?)```", re.S)


def python_blocks(text: str) -> tuple[list[str], list[str]]:
    """``(blocks to run, reasons of the blocks marked not run)``."""
    run, skipped = [], []
    for m in BLOCK.finditer(text):
        (skipped if m.group(1) else run).append(m.group(1) or m.group(2))
    return run, skipped


def docstring_example() -> str:
    """The indented ``import brorl_lab as bl`` example of the package docstring."""
    doc = brorl_lab.__doc__
    start = doc.index("    import brorl_lab as bl")
    lines = []
    for line in doc[start:].splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def run_blocks(blocks: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "blocks.py"
    script.write_text(
        "import sys\nns = {}\n"
        + "".join(f"print('--- block {i}', flush=True)\nexec(compile({b!r}, 'block {i}', 'exec'), ns)\n"
                  for i, b in enumerate(blocks)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_block_finder_sees_code_and_the_marker():
    text = "a\n```python\nx = 1\n```\n<!-- not run: needs a GPU -->\n```python\ny = 2\n```\n```bash\nls\n```\n"
    run, skipped = python_blocks(text)
    assert run == ["x = 1\n"] and len(skipped) == 1 and "needs a GPU" in skipped[0]


def test_every_python_block_of_the_readme_runs(tmp_path):
    run, skipped = python_blocks((REPO / "README.md").read_text())
    assert len(run) >= 2, "the README's quickstart block is missing"
    assert len(skipped) <= 2, f"more README blocks marked not run than expected: {skipped}"
    proc = run_blocks(run, tmp_path)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    assert proc.stdout.count("--- block") == len(run)


def test_the_package_docstring_example_runs(tmp_path):
    proc = run_blocks([docstring_example()], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_every_relative_link_of_it_and_the_docs_resolves():
    """The README is read in five minutes (<= 250 lines; the detail lives in docs/), and no link of the README or of
    a docs page points at a file that is not there (pages moved out of the README keep working links)."""
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    broken = []
    for page in [readme, *sorted((REPO / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_the_headline_and_its_figure_are_on_the_readme_first_screen():
    """The headline table (rendered from the shipped files by ``python -m brorl_lab render``) opens the README,
    with its figure (a dot per seed, the interval) right under it."""
    readme = (REPO / "README.md").read_text()
    start, end = readme.index("<!-- headline -->"), readme.index("<!-- /headline -->")
    assert start < 3000, "the headline results must be on the README's first screen"
    block = readme[start:end]
    assert block.count("\n| ") >= 3 and "](notebooks/figures/headline.png)" in block
    assert (REPO / "notebooks" / "figures" / "headline.png").is_file()
