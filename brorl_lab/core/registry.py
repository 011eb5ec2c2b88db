"""String-keyed registries (verl style): a sweep varies names, not code.

``Registry`` maps a name to an implementation; looking up a wrong name raises one ``ValueError`` that names the
registry, the value and the nearest valid name. ``registry_of(kind)`` finds the registry of a kind declared
by the package root, so :mod:`brorl_lab.core.config` validates names without importing the layers above it
(engines are registered as import strings, so naming the vllm engine never imports vllm).
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any, Optional
from collections.abc import Callable, Iterator

from brorl_lab.core.validation import did_you_mean


@dataclass(frozen=True)
class Prefix:
    """Names ``"<prefix>:<spec>"`` whose objects are built on demand (``rg:knights_knaves``, ``local:qa.jsonl``).

    ``check(spec)`` raises a one-line ``ValueError`` ("...; allowed: ...") when the spec names nothing (cheap: no
    building); ``build(spec, config)`` returns the object for a config dict, raising a one-line ``ValueError`` for a
    bad config. ``allowed`` describes the form for error messages (``"rg:<reasoning-gym dataset>"``).
    """

    check: Callable[[str], None]
    build: Callable[[str, dict], Any]
    allowed: str


class Registry:
    """A named mapping ``name -> object`` with a ``register`` decorator and helpful lookup errors.

    Besides registered names, a registry may accept prefixed names built on demand (:meth:`add_prefix`): an open
    set (any of reasoning-gym's datasets, any local file) cannot be registered up front. :meth:`names` lists the
    registered names only; :meth:`get` builds a prefixed name with an empty config on first use, and
    :meth:`configure` rebuilds it with a config (the latest configuration of a name is the one used).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}
        self._prefixes: dict[str, Prefix] = {}
        self._built: dict[str, tuple[dict, Any]] = {}  # prefixed name -> (config, object)

    def register(self, name: str, obj: Any = None) -> Callable:
        def add(o):
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._items[name] = o
            return o

        return add(obj) if obj is not None else add

    def add_prefix(self, prefix: str, check: Callable[[str], None], build: Callable[[str, dict], Any],
                   allowed: str) -> None:
        """Accept names ``"<prefix>:<spec>"``, checked by ``check(spec)`` and built by ``build(spec, config)``."""
        if prefix in self._prefixes or not prefix.isidentifier():
            raise ValueError(f"{self.kind} prefix {prefix!r}: registered twice or not an identifier")
        self._prefixes[prefix] = Prefix(check, build, allowed)

    def allowed(self) -> str:
        """The registered names and the prefixed forms, for the ``allowed:`` part of error messages."""
        return ", ".join([*self._items, *(p.allowed for p in self._prefixes.values())])

    def _prefix_of(self, name: Any) -> Optional[tuple[Prefix, str]]:
        if not isinstance(name, str) or ":" not in name:
            return None
        prefix, _, spec = name.partition(":")
        return (self._prefixes[prefix], spec) if prefix in self._prefixes else None

    def check_name(self, name: Any) -> None:
        """Raise one ``ValueError`` (naming the value and what is allowed) unless ``name`` is registered or a valid
        prefixed name. Builds nothing."""
        if isinstance(name, str) and name in self._items:
            return
        found = self._prefix_of(name)
        if found is None:
            near = did_you_mean(name, [*self._items, *(f"{p}:" for p in self._prefixes)])
            raise ValueError(f"unknown {self.kind} {name!r}{near}; allowed: {self.allowed()}")
        prefix, spec = found
        try:
            prefix.check(spec)
        except ValueError as e:
            raise ValueError(f"{self.kind} {name!r}: {e}") from None

    def build(self, name: str, config: Optional[dict] = None) -> Any:
        """A fresh object for ``name`` with ``config`` (prefixed names only; a registered name takes no config)."""
        self.check_name(name)
        if name in self._items:
            if config:
                raise ValueError(f"{self.kind} {name!r} is registered with a fixed configuration; allowed: a config "
                                 f"only for the prefixed forms ({', '.join(p.allowed for p in self._prefixes.values())})")
            return self._items[name]
        prefix, spec = self._prefix_of(name)
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"{self.kind} {name!r}: config {config!r} is a {type(config).__name__}; allowed: a dict")
        try:
            return prefix.build(spec, dict(config or {}))
        except ValueError as e:
            raise ValueError(f"{self.kind} {name!r}: {e}") from None

    def configure(self, name: str, config: Optional[dict] = None) -> Any:
        """Build ``name`` with ``config`` and make it what :meth:`get` returns (registered names: returned as is)."""
        config = copy.deepcopy(dict(config or {}))  # a notebook editing its dict later must not edit this one
        if name in self._items and not config:
            return self._items[name]
        cached = self._built.get(name)
        if cached is not None and cached[0] == config and not getattr(cached[1], "is_stale", lambda: False)():
            return cached[1]  # built objects may say their source changed (a local file edited since)
        obj = self.build(name, config)
        self._built[name] = (config, obj)
        return obj

    def get(self, name: str) -> Any:
        if isinstance(name, str) and name in self._items:
            return self._items[name]
        if isinstance(name, str) and name in self._built:
            return self._built[name][1]
        if self._prefix_of(name) is not None:
            return self.configure(name, {})
        raise ValueError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)}; allowed: {self.allowed()}")

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        """Registered names, and prefixed names already built (``get`` builds valid unbuilt ones)."""
        return name in self._items or name in self._built

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
