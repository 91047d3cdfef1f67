"""XLA compiler options for the model's forward steps, set by the run layer, and for the
detectors' exact selection programs (`selection_step`).

The CLI compiles with XLA's quick CPU pipeline (`fi_jax.run.xla_flags`: LLVM -O1, no fusion
emitters, set process-wide in XLA_FLAGS) because a small run is mostly the compilation of many
small programs. A model's forward is one large program that runs for every batch, and the
quick pipeline makes it slower (ResNet-50's elementwise fusions: batch norm, ReLU); so when
the run layer applied the quick flags, it also records here XLA's own defaults for them, and
`fi_jax.extract.forward.Forward` compiles its step with these options (`jax.jit`'s
`compiler_options`, which override XLA_FLAGS for that program only).

On the CPU the forward step also turns off XLA:CPU's YNNPACK fusions
(`xla_cpu_experimental_ynn_fusion_type` empty): with them, XLA hands the chain of elementwise
operations that feeds a LayerNorm or batch norm to a YNNPACK fusion whose inputs are
materialised slices, which made ConvNeXt-T's forward 1.8x and ResNet-50's 1.3x slower
(docs/performance.md). Without them XLA:CPU rewrites every row reduction longer than 32 (the
LayerNorm statistics, the softmax's max and sum) into an unfused reduce-window and a second
reduce (its `tree_reduction_rewriter` pass); the forward step disables that pass too, which
made ViT-B/16's and EVA-02-S's forwards ~5-10% faster (docs/performance.md). And it lets
LLVM use 512-bit vectors where the CPU has them (`xla_cpu_prefer_vector_width`; XLA prefers
256): EVA-02-S, ConvNeXt-T / V2-T, EfficientNet-B0 3-11% faster, ResNet-50 5% slower (still
~1.8x torch). Elsewhere, and with nothing recorded, the options are XLA_FLAGS' own.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

import jax

# the forward step's options on the CPU, whoever set XLA_FLAGS (see the module docstring)
CPU_FORWARD: dict[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": "",
                               "xla_disable_hlo_passes": "tree_reduction_rewriter",
                               "xla_cpu_prefer_vector_width": 512}

_MODEL_STEP: Optional[dict[str, Any]] = None


def model_step() -> Optional[dict[str, Any]]:
  """The compiler options of a model's forward step: on the CPU `CPU_FORWARD` plus what the
  run layer recorded (`set_model_step`); None when there are none."""
  options = _with_user_passes(dict(CPU_FORWARD)) if jax.default_backend() == "cpu" else {}
  options.update(_MODEL_STEP or {})
  return options or None


def selection_step() -> Optional[dict[str, Any]]:
  """The compiler options of the exact selection programs (KNN's blockwise search
  `fi_jax.detectors.knn.knn_order_stats`, ASH / SCALE's top-k pruning, and the jitted scores
  of the detectors with `selection_program`: CFOOD, GEN): on the CPU, XLA's
  `tree_reduction_rewriter` pass off, so each counting pass of a threshold search is one
  reduction instead of a reduce-window and a second reduce (KNN's search ~15% faster, the
  top-k masks 2-3x faster than XLA's TopK; docs/performance.md). Their long reductions are
  integer counts, maxima and minima, exact in any order; the float sums among them (NNGuide's
  top-k sums, ASH's s1 / s2, GEN's M terms) are float64 under x64. None elsewhere."""
  if jax.default_backend() != "cpu":
    return None
  return _with_user_passes({"xla_disable_hlo_passes": "tree_reduction_rewriter"})


def _with_user_passes(options: dict[str, Any]) -> dict[str, Any]:
  """options whose `xla_disable_hlo_passes` also names the passes the user disabled in
  XLA_FLAGS (compiler_options replace XLA_FLAGS' value for that program)."""
  passes = options.get("xla_disable_hlo_passes")
  if passes:
    user = re.findall(r"--xla_disable_hlo_passes=(\S+)", os.environ.get("XLA_FLAGS", ""))
    names = [n for v in user for n in v.split(",") if n] + passes.split(",")
    options["xla_disable_hlo_passes"] = ",".join(dict.fromkeys(names))
  return options


def set_model_step(options: Optional[Mapping[str, Any]]) -> None:
  """Records the options `model_step` adds (None clears them)."""
  global _MODEL_STEP
  _MODEL_STEP = dict(options) if options else None
