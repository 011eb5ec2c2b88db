"""String-keyed registries (verl style): a sweep varies names, not code.

``Registry`` maps a name to an implementation; looking up a wrong name raises one ``ValueError`` that names the
registry, the value and the nearest valid name. The ``*_names`` helpers let :mod:`brorl_lab.config` validate
names without importing heavy modules at import time (engines are registered as import strings, so naming the
vllm engine never imports vllm).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterator


class Registry:
    """A named mapping ``name -> object`` with a ``register`` decorator and helpful lookup errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None) -> Callable:
        def add(o):
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = o
            return o

        return add(obj) if obj is not None else add

    def get(self, name: str) -> Any:
        if name not in self._items:
            near = difflib.get_close_matches(str(name), list(self._items), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; allowed: {', '.join(self._items)}")
        return self._items[name]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"


def engine_names() -> list[str]:
    from .engines import ENGINES

    return ENGINES.names()


def advantage_names() -> list[str]:
    from .algo import ADVANTAGES

    return ADVANTAGES.names()


def policy_loss_names() -> list[str]:
    from .algo import POLICY_LOSSES

    return POLICY_LOSSES.names()


def advantage_needs_group(name: str) -> bool:
    from .algo import ADVANTAGES

    return getattr(ADVANTAGES.get(name), "needs_group", True)


def task_names() -> list[str]:
    from .tasks import TASKS

    return TASKS.names()
