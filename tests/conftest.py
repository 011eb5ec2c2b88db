"""Test-wide settings. vLLM must run its engine in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0); that has to
be set before vllm is first imported, so it is set for the whole session.

Two workers (``make test``: ``pytest -n 2 --dist loadgroup``, pytest-xdist). Each worker runs torch at one thread,
and so does every process it starts (OMP_NUM_THREADS=1): two torch processes that each take both cores thrash
(ARCHITECTURE.md). The tests of a module that builds something once for the module (a module- or session-scoped
fixture of its own: a trained tiny run, a built book, a bench run) stay together on one worker, so that fixture is
built once; the modules in SERIAL run on one worker, one after another (they watch the repository or the process
group, or start a Ray cluster). The slowest modules are handed out first, so neither worker is left with one at the end.
Without ``-n`` none of this changes anything."""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:  # before torch is imported: this worker and everything it starts at one thread
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"


NOTEBOOK_MODULES = ("test_notebooks_flagship", "test_notebooks_analysis", "test_theory_notebook", "test_theorem_notebook",
                    "test_allocation_notebook")
# One worker, one after another: the browser test checks nothing is written into the repo's notebooks/ and runs/
# while it runs; the Ray tests (these modules, and every test marked `ray`) start local clusters.
SERIAL = ("test_browser", "test_ray_engine")
# Slowest first (issue 45, a fresh-clone run: the tiny book 519 s, the bench smoke 460 s, the browser 143 s; the
# rest by their notebook or training runs): started first, none of them ends the run alone.
SLOW_FIRST = ("test_book", "test_bench", "test_notebooks_flagship", "test_browser", "test_notebooks_analysis",
              "test_course", "test_faults", "test_jobs", "test_paid", "test_first_minute")


def _builds_once(item) -> bool:
    """Whether the test uses a module- or session-scoped fixture defined in a test module (not conftest, not a
    plugin): built once per module, so the module's tests belong on one worker."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        d = defs[-1]
        if d.scope in ("module", "session", "package") and d.baseid and d.baseid.endswith(".py"):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    """Tests that execute a shipped notebook carry the `notebook` mark (`make test-fast` leaves them out); the
    pair-sync checks of those modules are quick and stay in the inner loop. Then the xdist groups and order (see
    the module docstring)."""
    import pytest

    for item in items:
        name = item.module.__name__
        if name in NOTEBOOK_MODULES and "pair" not in item.name:
            item.add_marker(pytest.mark.notebook)
        if item.get_closest_marker("xdist_group") is None:
            if name in SERIAL or item.get_closest_marker("ray"):
                item.add_marker(pytest.mark.xdist_group("serial"))
            elif _builds_once(item):
                item.add_marker(pytest.mark.xdist_group(name))
    if not XDIST_WORKER:
        return
    rank = {m: i for i, m in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.module.__name__, len(rank)))  # stable: each module keeps its own order


def pytest_configure(config):
    if XDIST_WORKER:
        import torch

        torch.set_num_threads(1)
