"""Suite-level sharing: inside `with detectors.shared():` work that several detectors repeat
on the *same* arrays is done once.

A suite runs many detectors, often in two presets, over one fit set and a few test sets. Much
of their work is common: MDS, RMDS, cosine and relative cosine read the same per-class sums
and within-class scatter; fDBD, NCI and DICE the same mean; KNN at k=50 and k=1000 the same
bank and the same similarity matmul (the suite's floor); and a preset pair that agrees on
every hyper-parameter (MSP, Energy, MDS, ...) is the same computation twice. Inside the scope
these are memoised by the *identity* of the arrays involved (the scope holds a reference to
each, so an id cannot be reused while it is open):

* `Detector.fit`: by (fit family, hyper-parameters that change the fit, fit set, head);
* `Detector.score`: by (class, hyper-parameters, state, outputs);
* `stats.moments`: by (fit set, group, shift); one pass with a scatter matrix also serves
  requests without it, and any pass serves the plain mean;
* KNN / NNGuide neighbour search: by (bank, query features); one search computes the k-th
  largest similarity (and top-k sum) for every k announced with `shared(detectors=...)`;
* WeiPer's scores: left by WeiPer+KLD's pass (scored first) by (W~, query features, r, row
  block).

Results are identical to unshared calls (the same functions on the same inputs); outside the
scope nothing is cached. A scope belongs to the thread that opened it: detectors running in
another thread (fi_jax.run.compile_ahead compiling ahead) have their own. Memory: the scope keeps what it memoised (fit states, scores, one
[N, number of k] per query set and bank) until it closes.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Hashable, Iterable, Optional

_LOCAL = threading.local()   # .scope: this thread's open scope (or absent)


def _scope() -> Optional["_Scope"]:
  return getattr(_LOCAL, "scope", None)


class _Scope:

  def __init__(self, ks: dict[str, set]):
    self.entries: dict[Hashable, Any] = {}
    self.alive: list[Any] = []          # keeps keyed objects alive: ids stay unique
    self.ks = {name: set(v) for name, v in ks.items()}
    self.hits = 0

  def key(self, objs: Iterable[Any], extra: tuple) -> tuple:
    objs = list(objs)
    self.alive.extend(objs)
    return tuple(id(o) for o in objs) + tuple(extra)


@contextlib.contextmanager
def shared(detectors: Iterable[Any] = ()):
  """Memoise shared work across the detectors called inside the block (see module doc).
  `detectors` (optional): the detectors that will run, so that nearest-neighbour detectors
  serve every k any of them needs from their first search. Nested scopes reuse the outer."""
  ks: dict[str, set] = {}
  for det in detectors:
    k = det.hparams.get("k") if hasattr(det, "hparams") else None
    if isinstance(k, int):
      ks.setdefault(det.name, set()).add(k)
  outer = _scope()
  if outer is not None:
    for name, v in ks.items():
      outer.ks.setdefault(name, set()).update(v)
    yield outer
    return
  _LOCAL.scope = _Scope(ks)
  try:
    yield _LOCAL.scope
  finally:
    _LOCAL.scope = None


def active() -> bool:
  return _scope() is not None


def memo(objs: Iterable[Any], extra: tuple, compute: Callable[[], Any]) -> Any:
  """compute() once per (identities of objs, extra) inside a scope; plain compute() outside."""
  scope = _scope()
  if scope is None:
    return compute()
  key = scope.key(objs, extra)
  if key in scope.entries:
    scope.hits += 1
    return scope.entries[key]
  out = compute()
  scope.entries[key] = out
  return out


def lookup(objs: Iterable[Any], extra: tuple, accept: Callable[[tuple, Any], bool]):
  """The first memoised value whose key starts with the identities of objs and whose
  (extra, value) `accept` approves; None outside a scope or when there is none."""
  scope = _scope()
  if scope is None:
    return None
  ids = tuple(id(o) for o in objs)
  for key, value in scope.entries.items():
    if key[:len(ids)] == ids and accept(key[len(ids):], value):
      scope.hits += 1
      return value
  return None


def store(objs: Iterable[Any], extra: tuple, value: Any) -> None:
  scope = _scope()
  if scope is not None:
    scope.entries[scope.key(objs, extra)] = value


def ks(name: str) -> frozenset:
  """The k announced for detector `name` in the scope (empty if none)."""
  scope = _scope()
  return frozenset() if scope is None else frozenset(scope.ks.get(name, ()))
