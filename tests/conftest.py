"""Session-wide test setup: float64 JAX and the torchvision import shim.

x64: fi_jax's pipeline runs with `jax_enable_x64` (metrics, covariances and pseudo-inverses in
float64), so the tests do too. Models stay float32 because they cast explicitly.

Shim: see tests/helpers/torchvision_shim.py; installed before any test imports torchvision (through
timm or open_clip).

XLA: the quick-compiling CPU pipeline the CLI uses on a CPU-only machine (fi_jax.run.xla_flags),
set before JAX starts its backend; the subprocesses the tests start inherit it.

Order: the tests marked `slow` run first (otherwise in collection order). pytest-xdist hands
tests out in collection order, so a long test collected last keeps one worker busy after the
other has finished; longest-first keeps both workers busy to the end.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")

import jax  # noqa: E402

from fi_jax.run import xla_flags
from tests.helpers import torchvision_shim

xla_flags.fast_cpu_compile()

jax.config.update("jax_enable_x64", True)
torchvision_shim.install()


def pytest_collection_modifyitems(config, items):
  """The `slow` tests first, each group in collection order (see the module docstring)."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
