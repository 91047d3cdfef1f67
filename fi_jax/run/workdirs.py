"""A workdir is made by the run that writes into it, never by the checks before it:
`missing(path)` lists the folders a check (validate's writability test) would create, and
`remove_empty(those)` takes them back when they are still empty.
"""
from __future__ import annotations

import os


def missing(path: str) -> list[str]:
  """The folders of `path` (itself and its parents) that do not exist yet, deepest first."""
  out, path = [], os.path.abspath(path)
  while path and not os.path.exists(path):
    out.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return out


def remove_empty(dirs: list[str]) -> None:
  """Removes the folders of `dirs` in order (deepest first) while they are empty."""
  for d in dirs:
    try:
      os.rmdir(d)
    except OSError:
      return
