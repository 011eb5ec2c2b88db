"""Test-wide settings. vLLM must run its engine in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0); that has to
be set before vllm is first imported, so it is set for the whole session.

Two workers (``make test``: ``pytest -n 2 --dist loadgroup``, pytest-xdist). Each worker runs torch at one thread,
and so does every process it starts (OMP_NUM_THREADS=1): two torch processes that each take both cores thrash
(ARCHITECTURE.md). Work is handed out a module at a time (:class:`ModuleScheduling`), so a module's own module- or
session-scoped fixture (a trained tiny run, a built book, a bench run) is built once; the modules in SERIAL and every
Ray test (a test named ``..._ray_...``) share one group, run on one worker one after another (they watch the
repository or the process group, or start a local Ray cluster). The slowest modules are handed out first, so neither
worker is left with one at the end. Without ``-n`` none of this changes anything.

Why not xdist's own ``loadgroup`` marks: xdist 3.8 groups by renaming ``item._nodeid``, which pytest 9 no longer
reads (a node's id is ``item._id``), so every mark was silently ignored and a module's fixture was built on both
workers (seen: the bench smoke run twice side by side)."""

import os
import re
from pathlib import Path

import pytest

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
# while it runs; the Ray tests (these modules, and every test named ..._ray_..., see scope_of) start local clusters.
SERIAL = ("test_browser", "test_ray_engine")
# Slowest first (issue 45, a fresh-clone run: the tiny book 519 s, the bench smoke 460 s, the browser 143 s; the
# rest by their notebook or training runs): started first, none of them ends the run alone.
SLOW_FIRST = ("test_book", "test_bench", "test_notebooks_flagship", "test_browser", "test_notebooks_analysis",
              "test_course", "test_faults", "test_jobs", "test_paid", "test_first_minute")


def pytest_itemcollected(item):
    """Tests that execute a shipped notebook carry the `notebook` mark (`make test-fast` leaves them out); the
    pair-sync checks of those modules are quick and stay in the inner loop."""
    if item.module.__name__ in NOTEBOOK_MODULES and "pair" not in item.name:
        item.add_marker(pytest.mark.notebook)


RAY_TEST = re.compile(r"(^|_)ray(_|$)")


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``serial`` for the SERIAL modules and every Ray test, else its module."""
    module, _, test = nodeid.partition("::")
    return "serial" if Path(module).stem in SERIAL or RAY_TEST.search(test.split("[")[0]) else module


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup`` (``make test``): :func:`scope_of`'s units, each whole on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The slowest modules first on each worker (see the module docstring)."""
    if not XDIST_WORKER:
        return
    rank = {m: i for i, m in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.module.__name__, len(rank)))  # stable: each module keeps its own order


def pytest_configure(config):
    if XDIST_WORKER:
        import torch

        torch.set_num_threads(1)
