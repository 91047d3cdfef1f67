"""SigLIP 2 NaFlex image towers (big_vision npz or HF) -> fixed-resolution big_vision ViT trees."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models import _posemb as posemb
from fi_jax.models._checkpoints import CheckpointError


def to_fixed_resolution(tree: dict, init_params: Mapping[str, Any]) -> dict:
  """A SigLIP 2 NaFlex image tower as a fixed-resolution ViT (exact when all patches are valid):
  the Dense `embedding` on (row, col, channel)-flattened patches becomes the equivalent Conv
  kernel, and the learned 2-D posemb grid is resized to the init's square grid the way NaFlex
  does it per image (bilinear with antialias). Other trees pass unchanged."""
  emb = tree.get("embedding", {})
  init_emb = init_params.get("embedding", {})
  if np.ndim(emb.get("kernel")) == 2 and len(np.shape(init_emb.get("kernel"))) == 4:
    ph, pw, c, d = np.shape(init_emb["kernel"])
    tree["embedding"] = {**emb, "kernel": np.asarray(emb["kernel"]).reshape(ph, pw, c, d)}
  pe = tree.get("pos_embedding")
  if pe is not None and np.ndim(pe) == 3 and np.shape(pe)[0] > 1 and "pos_embedding" in init_params:
    n, d = np.shape(init_params["pos_embedding"])[1:]
    g = int(round(np.sqrt(n)))
    if g * g != n:
      raise CheckpointError(f"NaFlex posemb needs a square init grid, got {n} patches.")
    tree["pos_embedding"] = posemb.resize_bilinear_antialias(pe, (g, g)).reshape(1, n, d)
  return tree
