"""XLA compiler options for the model's forward steps, set by the run layer.

The CLI compiles with XLA's quick CPU pipeline (`fi_jax.run.xla_flags`: LLVM -O1, no fusion
emitters, set process-wide in XLA_FLAGS) because a small run is mostly the compilation of many
small programs. A model's forward is one large program that runs for every batch, and the
quick pipeline makes it slower (ResNet-50's elementwise fusions: batch norm, ReLU); so when
the run layer applied the quick flags, it also records here XLA's own defaults for them, and
`fi_jax.extract.forward.Forward` compiles its step with these options (`jax.jit`'s
`compiler_options`, which override XLA_FLAGS for that program only). Unset (None): every
program compiles with XLA_FLAGS as they are.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

_MODEL_STEP: Optional[dict[str, Any]] = None


def model_step() -> Optional[dict[str, Any]]:
  """The compiler options of a model's forward step (None: XLA_FLAGS as they are)."""
  return dict(_MODEL_STEP) if _MODEL_STEP else None


def set_model_step(options: Optional[Mapping[str, Any]]) -> None:
  """Sets the options `model_step` returns (None clears them)."""
  global _MODEL_STEP
  _MODEL_STEP = dict(options) if options else None
