"""Test-wide settings. vLLM must run its engine in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0); that has to
be set before vllm is first imported, so it is set for the whole session."""

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
