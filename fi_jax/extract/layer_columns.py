"""Intermediate activations for detectors that read more than the penultimate layer.

`blocks(out)` picks each block's output from the `out` dict of a model's `(logits, out)` (or a
two-tower model's `(zimg, ztxt, out)`), `columns(out, reducers)` reduces every block to a small
per-image array inside the jitted extraction step, so that only [B, C] / [B, P, C] arrays leave
the device. The columns are named `layer/<reducer>/<block>` in a set's arrays (and in the
feature cache) and reach the detectors as `Outputs.extras` entries with the same keys.

Layouts (docs/detectors.md#layer-scores):
  * ViT family (fi_jax/models/vit.py, dinov2.py; big_vision's ViT gives the same `out`):
    out["encoder"]["blockNN"]["+mlp"], the residual stream after block NN, tokens [B, N, D]
    (class token, registers and patch tokens alike); blocks "block00".."blockNN".
  * CLIP / SigLIP image towers (clip.py, two_towers.py): the same under out["img/encoder"].
  * CNNs (resnet.py, resnetv2.py, regnet.py: "stem", "stage1".."stage4"; convnext.py, swin.py,
    efficientnet.py: "stem", "stage0".."stageK"): NHWC maps [B, H, W, C].

Reducers (pure jnp, float32):
  * "mean": the mean over positions -> [B, C]: the spatial mean of a CNN map (OpenOOD's
    'mean' feature type) and the mean over *all* tokens of a ViT block (class token included).
  * "gram": Sastry & Oore's Gram row statistic for powers p = 1..GRAM_POWERS -> [B, P, C]:
    with F [C, S] the activations (channels x positions), G_p = (F^p)(F^p)^T, the statistic is
    sign(r)|r|^(1/p) with r = G_p summed over its rows' entries (r_c = sum_j (G_p)_cj). It is
    computed as r_c = sum_k F_ck^p s_k with s_k = sum_j F_jk^p (no C x C matrix), with a
    per-position and per-channel rescaling that gives the same value without float32
    overflow or underflow (F^10 of activations above ~7 overflows float32 in the plain form).
"""
from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from fi_jax.common import columns as columns_lib

GRAM_POWERS = 10          # powers 1..10 (Sastry & Oore's default); detectors use a prefix
PREFIX = columns_lib.LAYER
FAMILIES = ("vit", "dinov2", "clip", "siglip (two_towers)", "pe_core", "big_vision ViT", "resnet",
            "resnetv2", "regnet", "convnext", "swin", "efficientnet")


def _vit_blocks(encoder) -> dict:
  out = {}
  for name, node in encoder.items():
    if re.fullmatch(r"block\d+", name) and isinstance(node, Mapping) and "+mlp" in node:
      out[name] = node["+mlp"]
  return out


def blocks(out, *, strict: bool = True) -> dict[str, jax.Array]:
  """{block name: activation} of a model's `out` dict, in forward order (see the module
  docstring for the layouts). An unknown layout is a ValueError naming the supported families
  (`strict`), or {} (`strict=False`: the caller reports the missing columns itself)."""
  found = {}
  if isinstance(out, Mapping):
    for key in ("encoder", "img/encoder"):
      if isinstance(out.get(key), Mapping):
        found = _vit_blocks(out[key])
        if found:
          break
    if not found:
      found = {k: v for k, v in out.items()
               if re.fullmatch(r"stem|stage\d+", k) and getattr(v, "ndim", 0) == 4}
      if not any(k.startswith("stage") for k in found):
        found = {}
  if not found:
    if not strict:
      return {}
    keys = sorted(out) if isinstance(out, Mapping) else type(out).__name__
    raise ValueError(f"No per-block outputs in the model's `out` ({keys}): layer detectors "
                     f"support the families {', '.join(FAMILIES)} (out['encoder']['blockNN']"
                     f"['+mlp'] tokens, or out['stem'] / out['stageK'] NHWC maps).")
  return {k: found[k] for k in order(found)}


def order(names: Sequence[str]) -> list[str]:
  """Block names in forward order: "stem" first, then by their number."""
  def key(n):
    m = re.search(r"(\d+)$", n)
    return (n != "stem", int(m.group(1)) if m else -1, n)
  return sorted(names, key=key)


def _positions(x: jax.Array) -> jax.Array:
  """[B, S, C] (positions, channels) of an NHWC map or a [B, N, D] token array, float32."""
  x = jnp.asarray(x)
  x = x.astype(jnp.float32) if x.dtype.itemsize < 4 else x
  if x.ndim == 4:
    return x.reshape(x.shape[0], -1, x.shape[-1])
  if x.ndim == 3:
    return x
  raise ValueError(f"A block output must be NHWC [B, H, W, C] or tokens [B, N, D], got shape "
                   f"{x.shape}.")


def reduce_mean(x: jax.Array) -> jax.Array:
  """Mean over positions (spatial or tokens): [B, C]."""
  return jnp.mean(_positions(x), axis=1)


def _safe(a):
  return jnp.where(a > 0, a, 1.0)


def gram_power(x: jax.Array, p: int) -> jax.Array:
  """sign(r)|r|^(1/p), r_c = sum_j ((F^p)(F^p)^T)_cj, F = the [C, S] activations: [B, C]."""
  f = _positions(x)                                   # [B, S, C]
  b = jnp.max(jnp.abs(f), axis=2, keepdims=True)       # per position: [B, S, 1]
  t = jnp.sum((f / _safe(b)) ** p, axis=2, keepdims=True)   # s_k / b_k^p
  w = f * b                                            # F_ck b_k
  a = jnp.max(jnp.abs(w), axis=1, keepdims=True)       # per channel: [B, 1, C]
  r = jnp.sum((w / _safe(a)) ** p * t, axis=1)         # r_c / a_c^p: [B, C]
  return a[:, 0, :] * jnp.sign(r) * jnp.abs(r) ** (1.0 / p)


def reduce_gram(x: jax.Array) -> jax.Array:
  """The Gram row statistic for powers 1..GRAM_POWERS: [B, P, C]."""
  return jnp.stack([gram_power(x, p) for p in range(1, GRAM_POWERS + 1)], axis=1)


REDUCERS: dict[str, Callable[[jax.Array], jax.Array]] = {"mean": reduce_mean,
                                                         "gram": reduce_gram}
# Columns a model computes itself in its `out` (no block reduction): {reducer: {name: out key}}.
# "local": GL-MCM's local score of a CLIP image tower (fi_jax.models.zero_shot_head.local_mcm),
# the column `layer/local/mcm` [B].
OUT_COLUMNS: dict[str, dict[str, str]] = {"local": {"mcm": "img/local_mcm"}}


def check_reducers(reducers: Sequence[str]) -> tuple[str, ...]:
  """The reducer names sorted, unknown ones a ValueError."""
  bad = sorted(set(reducers) - set(REDUCERS) - set(OUT_COLUMNS))
  if bad:
    raise ValueError(f"Unknown layer reducer(s) {bad}; valid: {sorted({*REDUCERS, *OUT_COLUMNS})}.")
  return tuple(sorted(set(reducers)))


def column(reducer: str, block: str) -> str:
  return columns_lib.layer_column(reducer, block)


def columns(out, reducers: Sequence[str], *, strict: bool = True) -> dict[str, jax.Array]:
  """{"layer/<reducer>/<block>": reduced [B, ...]} of every block of `out` (jnp; call it
  inside the jitted step so that only the reduced arrays leave the device); an `OUT_COLUMNS`
  reducer's columns are `out`'s own arrays, where `out` has them."""
  reducers = check_reducers(reducers)
  block_reducers = [r for r in reducers if r in REDUCERS]
  acts = blocks(out, strict=strict) if block_reducers else {}
  cols = {column(r, name): REDUCERS[r](a) for r in block_reducers for name, a in acts.items()}
  for r in reducers:
    for name, key in OUT_COLUMNS.get(r, {}).items():
      if isinstance(out, Mapping) and key in out:
        cols[column(r, name)] = out[key]
  return cols


def block_columns(arrays: Mapping, reducer: str) -> dict[str, object]:
  """{block: array} of a set's (or `Outputs.extras`') `layer/<reducer>/<block>` entries, in
  forward order."""
  head = f"{PREFIX}/{reducer}/"
  found = {k[len(head):]: v for k, v in (arrays or {}).items() if k.startswith(head)}
  return {k: found[k] for k in order(found)}


def is_column(key: str) -> bool:
  return columns_lib.is_layer_column(key)
