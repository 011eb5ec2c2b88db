"""String-keyed registries (verl style): a sweep varies names, not code.

``Registry`` maps a name to an implementation; looking up a wrong name raises one ``ValueError`` that names the
registry, the value and the nearest valid name. The registries live next to their implementations
(``rollout.tasks.TASKS``, ``rollout.engines.ENGINES``, ``rl.algo.ADVANTAGES``, ...); a Config's names are checked
against them at the rl boundary (:func:`brorl_lab.rl.spec.check`), never by :mod:`brorl_lab.core.config`, which
imports nothing above core. Engines are registered as import strings, so naming the vllm engine never imports vllm.

Registries load lazily: a registry built with ``names=(...)`` knows its names before any implementation is
imported (``rl.names``, ``rollout.engine_names`` declare them in modules that import no torch), so the CLI refuses
``--advantage grop`` or ``--engine trch`` in a fraction of a second. Looking up a declared name whose implementation
module was never imported is an error, and ``tests/test_first_minute.py`` checks that the package's implementations
are exactly the declared names, so the two cannot drift apart unseen. A name registered at run time (a notebook's own
policy loss) joins the names from then on; a fresh process (the CLI) knows the declared ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

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
    registered names only; :meth:`get` builds a prefixed name with its default (empty) config on first use and keeps
    it; :meth:`build` returns a fresh object for a config and keeps nothing, so configuring a name never changes
    what another caller gets (a run owns the families it built: ``brorl_lab.rl.spec.resolve``).
    """

    def __init__(self, kind: str, names: tuple[str, ...] = ()):
        self.kind = kind
        self.declared = tuple(names)  # names known before their implementations are imported (see module doc)
        self._items: dict[str, Any] = {}
        self._prefixes: dict[str, Prefix] = {}
        self._built: dict[str, Any] = {}  # prefixed name -> object built with the default (empty) config

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
        return ", ".join([*self.names(), *(p.allowed for p in self._prefixes.values())])

    def _prefix_of(self, name: Any) -> Optional[tuple[Prefix, str]]:
        if not isinstance(name, str) or ":" not in name:
            return None
        prefix, _, spec = name.partition(":")
        return (self._prefixes[prefix], spec) if prefix in self._prefixes else None

    def check_name(self, name: Any) -> None:
        """Raise one ``ValueError`` (naming the value and what is allowed) unless ``name`` is registered or a valid
        prefixed name. Builds nothing."""
        if isinstance(name, str) and name in self.names():
            return
        found = self._prefix_of(name)
        if found is None:
            near = did_you_mean(name, [*self.names(), *(f"{p}:" for p in self._prefixes)])
            raise ValueError(f"unknown {self.kind} {name!r}{near}; allowed: {self.allowed()}")
        prefix, spec = found
        try:
            prefix.check(spec)
        except ValueError as e:  # prefix the name, keep the exception's type (a bad file is not bad settings)
            e.args = (f"{self.kind} {name!r}: {e}",)
            raise

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
        try:  # a deep copy: a notebook editing its dict later must not edit the built object's
            return prefix.build(spec, copy.deepcopy(dict(config or {})))
        except ValueError as e:  # prefix the name, keep the exception's type (a bad file is not bad settings)
            e.args = (f"{self.kind} {name!r}: {e}",)
            raise

    def get(self, name: str) -> Any:
        """A registered object, or a prefixed name built with its default config (kept, and rebuilt when the object
        says its source changed: a local file edited since)."""
        if isinstance(name, str) and name in self._items:
            return self._items[name]
        if isinstance(name, str) and name in self.declared:
            raise LookupError(f"{self.kind} {name!r} is declared but its implementation was never imported; import "
                              "the module that registers it first")
        if self._prefix_of(name) is not None:
            cached = self._built.get(name)
            if cached is None or getattr(cached, "is_stale", lambda: False)():
                cached = self._built[name] = self.build(name, {})
            return cached
        raise ValueError(f"unknown {self.kind} {name!r}{did_you_mean(name, self.names())}; allowed: {self.allowed()}")

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        """Registered names, and prefixed names already built (``get`` builds valid unbuilt ones)."""
        return name in self._items or name in self._built

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        """The declared names (known without importing anything), then any other registered ones."""
        return [*self.declared, *(n for n in self._items if n not in self.declared)]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"
