"""Zero-shot CLIP score: MCM (docs/detectors.md#mcm)."""
from __future__ import annotations

from fi_jax.detectors.core import (
  Detector,
  check_number,
  fc,
  head_state,
  l2_normalize,
  l2_normalize_jit,
  log_max_softmax,
  matmul,
)


class MCM(Detector):
  """Maximum concept matching (Ming et al.): s = max_c softmax_c(cos(f, t_c) / tau), returned as
  its log (float64). f = the L2-normalised image embedding (Outputs.features); t_c = column c of
  the zero-shot Head's w, L2-normalised (w = logit scale x normalised prompt-averaged text
  embeddings, so normalising removes the scale; the bias is ignored). tau = 1 (OpenOOD, NINCO)."""
  name, needs = "mcm", frozenset({"features", "head"})
  defaults = {"temperature": 1.0}

  @classmethod
  def validate(cls, hp):
    check_number("mcm", hp, "temperature", lo=0, lo_open=True)

  def _fit(self, train, head):
    return {"text": l2_normalize_jit(fc(head_state(head)["w"]), axis=0)}

  def _score(self, state, features, logits):
    cos = matmul(l2_normalize(fc(features)), state["text"])
    return log_max_softmax(cos / self.hparams["temperature"])
