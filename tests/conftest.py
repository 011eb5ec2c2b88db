"""Test-wide settings. vLLM must run its engine in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0); that has to
be set before vllm is first imported, so it is set for the whole session.

Two workers (``make test``: ``pytest -n 2 --dist loadgroup``, pytest-xdist). Each worker runs torch at one thread,
and so does every process it starts (OMP_NUM_THREADS=1): two torch processes that each take both cores thrash
(ARCHITECTURE.md). Work is handed out in units (:func:`scope_of`): a module, or a part of one listed in SPLIT, so
that a module- or session-scoped fixture (a trained tiny run, a built book, a bench run) is built once; the modules in
BOOK_UNIT go with the tiny book, whose folder they share; the modules
in SERIAL and every Ray test (a test named ``..._ray_...``) share one unit, run on one worker one after another (they
watch the repository or the process group, or start a local Ray cluster).

Which unit next (:class:`LongestFirstScheduling`): the longest still waiting, by the measured seconds in
tests/durations.json (a unit not in it: its test count times the table's seconds per other test), to whichever
worker asks first: longest-processing-time-first, so the long units (the tiny book, the bench smoke, the notebook
runs) start at once and the end of the run is the short ones filling in. ``python -m bench.bench_suite`` writes the
table from a ``--durations`` profile and prints this schedule's estimated wall time. Without ``-n`` none of this
changes anything.

Why not xdist's own ``loadgroup`` marks: xdist 3.8 groups by renaming ``item._nodeid``, which pytest 9 no longer
reads (a node's id is ``item._id``), so every mark was silently ignored and a module's fixture was built on both
workers (seen: the bench smoke run twice side by side). Why not its ``loadscope`` order: it queues units by their
number of tests (``--loadscope-reorder``, on by default), which put the 207 fast bad-input tests first and the
five-test tiny book near the end, alone on one worker for its 5 to 9 minutes while the other had nothing left."""

import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray's token auth off for every process the tests start, said once for the whole session: Ray (2.59+) turns token
# auth on for a new local cluster by default, but a driver keeps the mode of its first connection, so a local
# cluster started after test_jobs's `ray start` cluster (auth off) was refused by its own GCS ("InvalidAuthToken ...
# RAY_AUTH_MODE is currently 'disabled'"; seen in CI and reproduced: test_jobs's Ray tests, then test_ray_engine).
os.environ["RAY_AUTH_MODE"] = "disabled"
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:  # before torch is imported: this worker and everything it starts at one thread
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"


NOTEBOOK_MODULES = ("test_notebooks_flagship", "test_notebooks_analysis", "test_theory_notebook", "test_theorem_notebook",
                    "test_allocation_notebook")
# One worker, one after another: the browser test checks nothing is written into the repo's notebooks/ and runs/
# while it runs; the Ray tests (these modules, and every test named ..._ray_..., see scope_of) start local clusters.
SERIAL = ("test_browser", "test_ray_engine")
# Modules handed out in parts: each test function (its parametrizations together) is a unit of its own, except
# the named groups, which stay together because their tests share an expensive module-scoped fixture.
SPLIT: dict[str, dict[str, tuple[str, ...]]] = {}
# One unit with the tiny book (it keeps the book's name and measured seconds): the modules whose notebooks the book
# executes at their test size, so each is executed once, into the session's book folder (``tiny_book_out``), and read
# by its tests and by the book's build (helpers_notebooks.executed_in_book).
BOOK_UNIT = ("test_book", "test_notebooks_flagship", "test_theory_notebook", "test_theorem_notebook",
             "test_allocation_notebook", "test_notebooks_analysis")
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_itemcollected(item):
    """Tests that execute a shipped notebook carry the `notebook` mark (`make test-fast` leaves them out); the
    pair-sync checks of those modules are quick and stay in the inner loop."""
    if item.module.__name__ in NOTEBOOK_MODULES and "pair" not in item.name:
        item.add_marker(pytest.mark.notebook)


RAY_TEST = re.compile(r"(^|_)ray(_|$)")


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``serial`` for the SERIAL modules and every Ray test; for a SPLIT
    module ``<module>::<group>`` (a named group) or ``<module>::<test function>``; else its module."""
    module, _, test = nodeid.partition("::")
    function = test.split("[")[0].rsplit("::", 1)[-1]  # a class's method: its own name
    stem = Path(module).stem
    if stem in SERIAL or RAY_TEST.search(function):
        return "serial"
    if stem in BOOK_UNIT:
        return "tests/test_book.py"
    if stem in SPLIT:
        group = next((g for g, members in SPLIT[stem].items() if function in members), function)
        return f"{module}::{group}"
    return module


def unit_estimate(table: dict, unit: str, tests: int) -> float:
    """Seconds a unit is expected to take: its measured figure, else its tests at the table's per-test figure."""
    return table.get("units", {}).get(unit, tests * table.get("other_test_s", 0.5))


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup`` (``make test``): :func:`scope_of`'s units, each whole on one worker, the longest
    first (see the module docstring)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    table = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}

    class LongestFirstScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            longest = max(self.workqueue, key=lambda u: unit_estimate(table, u, len(self.workqueue[u])))
            self.workqueue.move_to_end(longest, last=False)  # the parent pops the first unit
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            """The parent's, with a worker given its next unit only when it is down to its last test (xdist
            waits until 2): a worker busy with a long test does not take the next long unit from an idle one.
            A worker runs a test once it knows the next one (or is told to stop), so 1 is as low as this goes."""
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return LongestFirstScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_book_out(tmp_path_factory) -> Path:
    """The session's tiny-book folder: what the notebook tests execute into (helpers_notebooks.executed_in_book) and
    the book's build (tests/test_book.py) completes; $BRORL_BOOK_TEST_OUT keeps one between sessions (the builder's
    cache then skips every notebook whose key has not changed)."""
    if os.environ.get("BRORL_BOOK_TEST_OUT"):
        return Path(os.environ["BRORL_BOOK_TEST_OUT"])
    return tmp_path_factory.mktemp("book")


def pytest_configure(config):
    if XDIST_WORKER:
        import torch

        torch.set_num_threads(1)
