"""XLA's CPU compiler set for quick compiles, for processes that run XLA on the CPU only.

A small run on CPU is mostly XLA compilation (the demo: ~150 programs), and XLA's default CPU
pipeline spends most of that time on the new MLIR fusion emitters and LLVM's -O3. With the
elemental fusion emitters (`--xla_cpu_use_fusion_emitters=false`) and LLVM at -O1
(`--xla_backend_optimization_level=1`) the demo compiles in about two thirds of the CPU time,
while what runs is as fast: matmuls and convolutions are library calls either way, and the
elementwise fusions at -O1 measure the same (`bench/extract.py`, `bench/detectors.py`, the
demo's training steps; the figures are in docs/performance.md). -O0 would halve the compile
time again but makes the training twice as slow.

The flags only take effect when set before JAX starts its backend (XLA reads XLA_FLAGS
once), so `fast_cpu_compile()` is called by the CLI before any JAX work. They are applied only
when the process will run on the CPU alone: `jax_platforms` (JAX_PLATFORMS) is 'cpu', or no
accelerator plugin is installed (`jax_plugins` modules or entry points, libtpu); on a GPU or
TPU machine `xla_backend_optimization_level` would also lower the accelerator's code. A flag
the user already put in XLA_FLAGS is never changed. Results differ from the default
pipeline's in the last bits (another code generator, which the demo's training amplifies); `results.json` records XLA_FLAGS in `meta.xla_flags`.

The model's forward steps are the exception: one large program run for every batch, which
the quick pipeline makes slower (a ResNet-50 forward ~1.2-1.4x: its batch-norm / ReLU
fusions), so when `fast_cpu_compile` adds the flags it also records XLA's defaults for them
as the forward step's `compiler_options` (`fi_jax.common.compile_options`).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
from typing import MutableMapping, Optional, Sequence

import jax

from fi_jax.common import compile_options

# flag -> value; each is known to the pinned jaxlib and to TensorFlow's XLA (an unknown flag in
# XLA_FLAGS aborts the process)
FAST_CPU_COMPILE = {"xla_cpu_use_fusion_emitters": "false", "xla_backend_optimization_level": "1"}
# XLA's own defaults for the same flags: a model's forward step compiles with these
# (fi_jax.common.compile_options) when the quick flags were applied
XLA_DEFAULTS = {"xla_cpu_use_fusion_emitters": True, "xla_backend_optimization_level": 3}


def accelerator_plugins() -> list[str]:
  """The installed JAX accelerator plugins (the `jax_plugins` namespace modules and entry
  points, and libtpu): with none, JAX can only run on the CPU."""
  found = []
  try:
    import jax_plugins  # # noqa: F401
    found += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
  except ImportError:
    pass
  found += [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
  if importlib.util.find_spec("libtpu") is not None:
    found.append("libtpu")
  return sorted(set(found))


def cpu_only(platforms: Optional[str] = None, plugins: Optional[Sequence[str]] = None) -> bool:
  """True when this process's JAX can only use the CPU: `platforms` (default: the
  jax_platforms setting) is 'cpu', or no accelerator plugin is installed."""
  platforms = jax.config.jax_platforms if platforms is None else platforms
  if platforms:
    return {p.strip() for p in platforms.split(",") if p.strip()} == {"cpu"}
  return not (accelerator_plugins() if plugins is None else plugins)


def _flag_names(xla_flags: str) -> set[str]:
  return {f.lstrip("-").partition("=")[0] for f in xla_flags.split() if f.startswith("--")}


def backend_started() -> bool:
  """Whether JAX has started its backends (XLA has then read XLA_FLAGS)."""
  from jax._src import xla_bridge
  return xla_bridge.backends_are_initialized()


def fast_cpu_compile(environ: Optional[MutableMapping[str, str]] = None, *,
                     platforms: Optional[str] = None,
                     plugins: Optional[Sequence[str]] = None,
                     started: Optional[bool] = None) -> list[str]:
  """Appends FAST_CPU_COMPILE's flags that XLA_FLAGS does not set yet to XLA_FLAGS in `environ`
  (os.environ), when the process runs on the CPU only (`cpu_only`) and JAX's backend has not
  started; returns the flags added ([] when none: not CPU-only, already started, or the user
  set them all)."""
  environ = os.environ if environ is None else environ
  started = backend_started() if started is None else started
  if started or not cpu_only(platforms, plugins):
    return []
  current = environ.get("XLA_FLAGS", "")
  have = _flag_names(current)
  added = [f"--{k}={v}" for k, v in FAST_CPU_COMPILE.items() if k not in have]
  if added:
    environ["XLA_FLAGS"] = " ".join([current.strip(), *added]).strip()
    if environ is os.environ:   # this process: its model forward keeps XLA's defaults
      compile_options.set_model_step({k: XLA_DEFAULTS[k] for k in FAST_CPU_COMPILE
                                      if k not in have})
  return added
