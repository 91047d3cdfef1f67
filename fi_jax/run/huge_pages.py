"""Transparent huge pages for the process's malloc, set by re-executing it once at start.

XLA:CPU, NumPy and faiss take every large array (a set's logits, a score block's distances)
from glibc's malloc, which maps it fresh and returns it to the kernel when freed: each new
array is faulted in and zeroed 4 KiB page by page. On a Linux host whose transparent huge pages
are in the common `madvise` mode, glibc's tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35)
makes malloc ask for 2 MiB pages instead: fewer faults for the same work, so XLA:CPU's
memory-bound ops and the compiled detector suite run faster (measured in docs/performance.md,
"Huge pages for malloc"). Values are unchanged: only the page size of the memory differs.

glibc reads GLIBC_TUNABLES once, when the process starts, so `reexec()` starts the process
again (the same interpreter and command line, `sys.orig_argv`) with the tunable added, before
the caller has done any work. It does nothing when:

* the platform is not Linux with glibc >= 2.35, or transparent huge pages are `never` (no
  effect) or `always` (every large mapping already gets them);
* GLIBC_TUNABLES already sets `glibc.malloc.hugetlb` (the user's value is kept);
* `FI_JAX_HUGE_PAGES=0` (the opt-out), or this process was itself started by `reexec()`.

The CLI (`main.py`, the `fi-jax` script) and the detector benches call it first thing.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "FI_JAX_HUGE_PAGES"        # "0": never re-execute
MARK = "FI_JAX_HUGE_PAGES_REEXEC"    # set in the re-executed process: it never re-executes
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version() -> Optional[tuple[int, int]]:
  """(major, minor) of the C library when it is glibc, else None."""
  try:
    name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, ValueError, OSError, TypeError):
    return None


def thp_mode(path: str = THP_ENABLED) -> Optional[str]:
  """The kernel's transparent huge page mode ('always', 'madvise', 'never'), None if unknown."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def _hugetlb_values(tunables: str) -> list[str]:
  """The values `glibc.malloc.hugetlb` is given in a GLIBC_TUNABLES string, in order."""
  return [t.partition("=")[2] for t in tunables.split(":") if t.partition("=")[0] == TUNABLE]


def tunables_with_huge_pages(environ: Mapping[str, str], *, platform: str,
                             glibc: Optional[tuple[int, int]], thp: Optional[str]
                             ) -> Optional[str]:
  """The GLIBC_TUNABLES value to re-execute with, or None when nothing is to be done (the
  conditions in the module doc)."""
  if environ.get(OPT_OUT, "1") == "0" or environ.get(MARK):
    return None
  if not platform.startswith("linux") or glibc is None or glibc < (2, 35) or thp != "madvise":
    return None
  current = environ.get("GLIBC_TUNABLES", "")
  if _hugetlb_values(current):
    return None
  return ":".join(filter(None, [current, f"{TUNABLE}=1"]))


def in_use(environ: Mapping[str, str] = os.environ) -> bool:
  """Whether this process's malloc was started with `glibc.malloc.hugetlb` on (1 or 2)."""
  values = _hugetlb_values(environ.get("GLIBC_TUNABLES", ""))
  return bool(values) and values[-1] not in ("", "0")


def on_this_host(environ: Mapping[str, str]) -> Optional[str]:
  """`tunables_with_huge_pages` for this process's platform, glibc and kernel."""
  return tunables_with_huge_pages(environ, platform=sys.platform, glibc=glibc_version(),
                                  thp=thp_mode())


def reexec() -> None:
  """Re-execute this process with `glibc.malloc.hugetlb=1` when `tunables_with_huge_pages`
  says so (never returns then, unless the exec itself fails); otherwise return at once. Call
  it before any work: the process starts again from the beginning, with the same pid,
  arguments and environment."""
  value = on_this_host(os.environ)
  argv = list(getattr(sys, "orig_argv", ()))
  if value is None or len(argv) < 2 or argv[1] == "-":   # no command line to start again
    return
  env = dict(os.environ, GLIBC_TUNABLES=value, **{MARK: "1"})
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, [sys.executable] + argv[1:], env)
  except OSError:   # no interpreter to start again (sys.executable empty, ...): go on as is
    return
