"""The usage error of this package: a wrong name, config, option or count key."""
from __future__ import annotations


class UsageError(ValueError):
  """A wrong name, config, option or count key (the CLI exits with code 2 on it)."""
