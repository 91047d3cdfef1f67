"""JAX's persistent compilation cache in a run: turned on (`use`), and a bad entry named.

JAX stores each compiled program in `config.compilation_cache_dir` under a key computed from
the program; an entry holds no copy of its key. An entry that holds another key's program (the
files swapped, or copied between folders or machines) is loaded as it is, and the run then
stops deep inside JAX or XLA: a parameter of the wrong size ("RuntimeProgramInputMismatch ...
incompatible size"), an output "incompatible with its layout annotation", a count of outputs
or layouts that does not match (`safe_zip()`, or JAX's assertion on the counts).
`points_to_cache(error)` recognises those errors when this process has loaded a program from
the persistent cache (JAX's cache-hit event, counted from `use` on), and
`CompilationCacheError` says, in one line, which folder to delete. A swapped entry whose
program has exactly the signature of the right one runs without an error; no check can see
that from the entry (JAX's `jax_compilation_cache_check_contents` recompiles every program
once to compare, which is what the cache is there to avoid).
"""
from __future__ import annotations

import os
import re
import threading
import traceback
from typing import Optional

import jax
from jax.experimental.compilation_cache import compilation_cache

_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_hits = 0
_lock = threading.Lock()
_listening = False


class CompilationCacheError(ValueError):
  """A program loaded from the persistent compilation cache does not fit its call."""


def default_dir() -> str:
  """~/.cache/fi_jax/jax_cache (under $XDG_CACHE_HOME when set)."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "fi_jax", "jax_cache")


def _count(event: str, **kwargs) -> None:
  del kwargs
  global _hits
  if event == _HIT_EVENT:
    with _lock:
      _hits += 1


def hits() -> int:
  """How many programs this process has loaded from the persistent cache since `use`."""
  return _hits


def use(path: Optional[str]) -> Optional[str]:
  """Turns on JAX's persistent compilation cache in `path` (None: the default folder; '':
  off), caching every compilation however quick or small, so that a rerun compiles nothing.
  Returns the folder in use (None when off). Cache hits are counted from here on."""
  global _listening
  path = default_dir() if path is None else os.path.expanduser(path)
  if jax.config.jax_compilation_cache_dir != (path or None):
    jax.config.update("jax_compilation_cache_dir", path or None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()   # applies the new folder even after earlier compilations
  if not _listening:
    jax.monitoring.register_event_listener(_count)
    _listening = True
  return path or None


def _chain(e: BaseException):
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def _count_check(e: AssertionError) -> bool:
  """JAX's check that a compiled program has as many inputs / outputs (shardings, memory
  kinds) as its call (`assert len(x) == n, (len(x), n)`: the message is a tuple of counts),
  raised in JAX's own code: its frames are in the jax package, or (JAX's traceback filtering
  removes them) the innermost frame left is a call, not an assert statement."""
  if not re.fullmatch(r"\(\d+(, \d+)+\)", str(e)):
    return False
  frames = traceback.extract_tb(e.__traceback__)
  if not frames:
    return False
  last = frames[-1]
  in_jax = f"{os.sep}jax{os.sep}" in last.filename or f"{os.sep}jaxlib{os.sep}" in last.filename
  return in_jax or not (last.line or "").lstrip().startswith("assert")


def _signature(e: BaseException) -> bool:
  """An error a program of another key gives: a parameter of the wrong size, an output
  incompatible with its layout, or a count of inputs / outputs / layouts that does not match."""
  text = str(e)
  if type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
    return "RuntimeProgramInputMismatch" in text or (
        "Executable(" in text and "expected parameter" in text)
  if isinstance(e, ValueError):
    return (text.startswith("safe_zip() argument")
            or "incompatible with its layout annotation" in text)
  if isinstance(e, AssertionError):
    return _count_check(e)
  return False


def points_to_cache(e: BaseException) -> bool:
  """Whether `e` (or an error it came from) is what a program of another key gives, in a
  process that has loaded programs from the persistent compilation cache."""
  if not jax.config.jax_compilation_cache_dir or not _hits:
    return False
  return any(_signature(x) for x in _chain(e))


def error(e: BaseException, folder: Optional[str] = None) -> CompilationCacheError:
  """The one-line error for `e`, naming the cache folder and what to do."""
  folder = folder or jax.config.jax_compilation_cache_dir
  cause = next((x for x in _chain(e) if _signature(x)), e)
  lines = [ln.strip() for ln in str(cause).splitlines()]
  text = " ".join(ln for ln in lines if ln and not ln.startswith(("-", "See http", "For simp")))
  text = text if len(text) <= 240 else text[:237] + "..."
  return CompilationCacheError(
      f"the JAX compilation cache {folder} gave a compiled program that does not fit the "
      f"call asking for it ({type(cause).__name__}: {text}): its entries were swapped, "
      f"copied from elsewhere or damaged. Delete that folder (rm -rf {folder}) and run again, "
      "or run with --config.compilation_cache_dir='' to compile without it; the feature "
      "cache keeps every finished set.")
