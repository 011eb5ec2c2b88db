"""String-keyed registries (verl style): a sweep varies names, not code.

``Registry`` maps a name to an implementation; looking up a wrong name raises one ``ValueError`` that names the
registry, the value and the nearest valid name. ``registry_of(kind)`` finds the registry of a kind declared
by the package root, so :mod:`brorl_lab.core.config` validates names without importing the layers above it
(engines are registered as import strings, so naming the vllm engine never imports vllm).
"""

from __future__ import annotations

import importlib
from typing import Any
from collections.abc import Callable, Iterator

from brorl_lab.core.validation import did_you_mean


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
            raise ValueError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)}; allowed: {', '.join(self._items)}")
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


# ---- registries by kind ----------------------------------------------------------------------------------------
# Core validates names (Config.engine, Config.advantage, ...) whose registries live in the layers above it. Core
# may not import upward, so the package root (brorl_lab/__init__.py, the composition root) declares where each kind
# lives as an import string, the way entry points work; the owning module is imported on first lookup only.
_PROVIDERS: dict[str, str] = {}


def provide(kind: str, target: str) -> None:
    """Declare that the registry of ``kind`` is ``target`` (``"package.module:ATTRIBUTE"``)."""
    _PROVIDERS[kind] = target


def registry_of(kind: str) -> Registry:
    """The registry declared for ``kind`` (``'engine'``, ``'advantage'``, ``'policy_loss'``, ``'task'``,
    ``'tracker'``)."""
    if kind not in _PROVIDERS:
        raise ValueError(f"registry kind: got {kind!r}; allowed: {', '.join(_PROVIDERS)}")
    module, _, attr = _PROVIDERS[kind].partition(":")
    return getattr(importlib.import_module(module), attr)


def names_of(kind: str) -> list[str]:
    return registry_of(kind).names()
