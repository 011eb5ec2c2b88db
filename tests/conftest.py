"""Test-wide settings. vLLM must run its engine in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0); that has to
be set before vllm is first imported, so it is set for the whole session."""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


NOTEBOOK_MODULES = ("test_notebooks_flagship", "test_notebooks_analysis", "test_theory_notebook", "test_theorem_notebook",
                    "test_allocation_notebook")


def pytest_collection_modifyitems(config, items):
    """Tests that execute a shipped notebook carry the `notebook` mark (`make test-fast` leaves them out); the
    pair-sync checks of those modules are quick and stay in the inner loop."""
    import pytest

    for item in items:
        if item.module.__name__ in NOTEBOOK_MODULES and "pair" not in item.name:
            item.add_marker(pytest.mark.notebook)
