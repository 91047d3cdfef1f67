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
import pytest  # noqa: E402

from fi_jax.run import xla_flags
from tests.helpers import torchvision_shim

xla_flags.fast_cpu_compile()

jax.config.update("jax_enable_x64", True)
torchvision_shim.install()


def pytest_collection_modifyitems(config, items):
  """The `slow` tests first, each group in collection order (see the module docstring)."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# ------------------------------------------------------------------ progress of a long suite

def _clock(seconds: float) -> str:
  minutes, seconds = divmod(int(seconds), 60)
  return f"{minutes}m{seconds:02d}s"


@pytest.hookimpl(trylast=True)   # after pytest's terminal reporter is registered
def pytest_configure(config):
  """Each line of dots ends with the tests done / collected (pytest.ini's
  console_output_style = count), the wall-clock time so far and an estimate of what is left
  (elapsed x tests left / tests done: a linear estimate, so a slow module late in the suite
  makes it grow). Only in the process that prints (under xdist, the controller)."""
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  message = getattr(reporter, "_get_progress_information_message", None)
  if (reporter is None or message is None or hasattr(config, "workerinput")
      or not hasattr(reporter, "_screen_width")):
    return   # another pytest, or an xdist worker: pytest's own progress only
  import time
  start = time.monotonic()
  width = len(" 999m59s, ~999m59s left")
  reporter._screen_width -= width   # the line breaks early enough to fit the longer message

  def with_time() -> str:
    text = message()
    session = getattr(reporter, "_session", None)
    done, total = reporter.reported_progress, getattr(session, "testscollected", 0)
    elapsed = time.monotonic() - start
    if not done or not total:
      return text
    extra = f" {_clock(elapsed)}"
    if done < total:
      extra += f", ~{_clock(elapsed * (total - done) / done)} left"
    return text + extra.ljust(width)

  reporter._get_progress_information_message = with_time
