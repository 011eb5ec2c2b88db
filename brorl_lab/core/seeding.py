"""Stable seeds derived from parts (run seed, step, round, shard...): sha256, not Python's salted ``hash``, so a
seed is the same in every process and on every machine, and independent of any global RNG state."""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A 31-bit seed from ``parts`` joined with '/': ``derive_seed(0, "rollout", 3, 1)``."""
    h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF
