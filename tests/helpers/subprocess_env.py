"""XLA_FLAGS for the subprocesses the tests start.

A test that sets XLA_FLAGS for a subprocess (to ask for several CPU devices) replaces the
quick-compile flags the suite runs with (tests/conftest.py, fi_jax.run.xla_flags), and the
subprocess would then compile with XLA's slower default CPU pipeline. `xla_flags` keeps them.
"""
from __future__ import annotations

from typing import Optional

from fi_jax.run import xla_flags as _xla_flags


def xla_flags(devices: Optional[int] = None) -> str:
  """The suite's quick-compile XLA flags, plus `devices` simulated CPU devices if given."""
  flags = [f"--{k}={v}" for k, v in _xla_flags.FAST_CPU_COMPILE.items()]
  if devices is not None:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)
