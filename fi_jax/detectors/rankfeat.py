"""RankFeat (Song et al. NeurIPS 2022): the energy of the logits after removing the rank-1
component of a late feature map; needs the model, so it scores images during extraction
(docs/detectors.md#rankfeat).

The forward is continued after the target block with its output modified, without touching
the model files: `flax.linen.intercept_methods` replaces the output of that block's `__call__`.
Targets are found by module class and name when the model's top module is called:
* ResNet (fi_jax.models.resnet, `layer{s}_{b}` blocks): the last block of stage 4 (and of
  stage 3 for the block-3 variant), i.e. torchvision's `layer4` / `layer3` output;
* BiT ResNetV2 (fi_jax.models.resnetv2, `stage{s-1}_{b}` blocks): the last block of stage 4 / 3
  (before the final GroupNorm-ReLU, as the official code's `body.block4` output);
* ViT encoders (fi_jax.models.vit.Encoder, `encoderblock_{i}`; also dinov2 and the image
  towers of clip and siglip): the token matrix [N, D] (all tokens) returned by block
  `depth + vit_block` (-2: the official ViT-B/16 form, the last block then runs; -1: the
  official T2T-ViT form, the final norm and the head follow); the block's "+mlp" intermediate
  (the same tokens) is replaced too, so heads that read it (DINOv2's 4-layer head) see the
  modified tokens.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.detectors.core import (
  HIGHEST,
  Detector,
  check_bool,
  check_choice,
  check_number,
  energy,
  fc,
  require,
)
from fi_jax.models import resnet, resnetv2, vit

SUPPORTED = ("resnet (fi_jax.models.resnet: torchvision / timm ResNet, ResNeXt, Wide ResNet)",
             "resnetv2 (fi_jax.models.resnetv2: BiT)",
             "vit (fi_jax.models.vit.Encoder, unrolled: vit, dinov2, clip / siglip image towers)")
# fi_jax.models modules (config.model_name) whose models have the blocks above; configs leave
# RankFeat out for other families (configs/common.py)
MODEL_FAMILIES = ("resnet", "resnetv2", "vit", "dinov2", "clip", "two_towers")
STAGES = {"4": (4,), "3": (3,), "3+4": (4, 3)}   # the block-4 logits come first, as OpenOOD
POWER_ITERATION_SEED = 0


# ----------------------------------------------------------------------------- rank-1 removal

def _l2n(x, eps: float = 1e-10):
  return x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + eps)


def rank1_component(f, *, accelerate: bool = False, iterations: int = 20):
  """sigma_1 u_1 v_1^T of each f[b] ([B, M, N], float32 or wider).

  accelerate=False: `jnp.linalg.svd`. accelerate=True: the official code's power iteration,
  `iterations` rounds of p <- f c / |f c|, c <- f^T p / |f^T p| (|.| + 1e-10) from a fixed
  N(0, 1) start c over the last axis (the official start is unseeded); sigma = p^T f c."""
  if not accelerate:
    u, s, vh = jnp.linalg.svd(f, full_matrices=False)
    return s[:, :1, None] * u[:, :, :1] * vh[:, :1, :]
  b, m, n = f.shape
  c0 = jax.random.normal(jax.random.PRNGKey(POWER_ITERATION_SEED), (n,), f.dtype)
  mv = functools.partial(jnp.einsum, precision=HIGHEST)

  def body(_, pc):
    p = _l2n(mv("bmn,bn->bm", f, pc[1]))
    return p, _l2n(mv("bmn,bm->bn", f, p))
  p, c = jax.lax.fori_loop(0, iterations, body,
                           (jnp.zeros((b, m), f.dtype), jnp.broadcast_to(c0, (b, n))))
  sigma = mv("bm,bmn,bn->b", p, f, c)
  return sigma[:, None, None] * p[:, :, None] * c[:, None, :]


def remove_rank1(x, *, accelerate: bool = False, iterations: int = 20):
  """x [B, ..., C] minus the rank-1 component of each sample's [positions, C] matrix (the same
  component as of the official [C, positions] layout, transposed), computed in float32 (or the
  wider input dtype); returns x's dtype."""
  f = x.reshape(x.shape[0], -1, x.shape[-1])
  f = f.astype(jnp.promote_types(f.dtype, jnp.float32))
  f = f - rank1_component(f, accelerate=accelerate, iterations=iterations)
  return f.reshape(x.shape).astype(x.dtype)


# ----------------------------------------------------------------------------- interception

class _Intercept:
  """The interceptor of one modified forward: when a supported top module is called it picks
  the target block among that module's children; the target's output goes through `modify`."""

  def __init__(self, stage: int, vit_block: int, modify: Callable):
    self.stage, self.vit_block, self.modify = stage, vit_block, modify
    self.targets: list[tuple[nn.Module, str]] = []
    self.hits: list[str] = []
    self.family = None

  def _register(self, m) -> None:
    if isinstance(m, (resnet.ResNet, resnetv2.ResNetV2)):
      family = "resnet" if isinstance(m, resnet.ResNet) else "resnetv2"
      require(len(m.depths) == 4, f"rankfeat: a {family} model with 4 stages is needed, got "
                                  f"depths {tuple(m.depths)}.")
      s = self.stage
      name = (f"layer{s}_{m.depths[s - 1] - 1}" if family == "resnet"
              else f"stage{s - 1}_{m.depths[s - 1] - 1}")
    elif isinstance(m, vit.Encoder):
      family = "vit"
      require(not m.scan, "rankfeat needs the ViT's blocks unrolled (model scan=False): a "
                          "scanned encoder has no per-block module to modify.")
      i = m.depth + self.vit_block
      require(i >= 0, f"rankfeat: vit_block={self.vit_block} needs at least {-self.vit_block} "
                      f"encoder blocks; the model has {m.depth}.")
      name = f"encoderblock_{i}"
    else:
      return
    self.family = family
    self.targets.append((m, name))

  def __call__(self, next_fun, args, kwargs, context):
    m = context.module
    if context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    self._register(m)
    if not any(m.parent is top and m.name == name for top, name in self.targets):
      return next_fun(*args, **kwargs)
    self.hits.append("/".join(m.path) if hasattr(m, "path") else str(m.name))
    y = next_fun(*args, **kwargs)
    if isinstance(m, vit.Encoder1DBlock):   # (tokens, intermediates): "+mlp" is the output too
      x = self.modify(y[0])                  # (DINOv2's 4-layer head reads it)
      return x, {**y[1], "+mlp": x}
    return self.modify(y)


def modified_logits(logits_fn: Callable, images, *, stage: int, vit_block: int,
                    modify: Callable):
  """(logits of `logits_fn(images)` with the target block's output replaced by
  `modify(output)`, the family found). `logits_fn` must call the Flax model's `apply` when
  called (not a cached jax.jit of it: the interceptor acts while the model is traced)."""
  icpt = _Intercept(stage, vit_block, modify)
  with nn.intercept_methods(icpt):
    z = logits_fn(images)
  require(icpt.hits, "rankfeat: no supported block was called by the model's forward. "
          f"Supported model families: {'; '.join(SUPPORTED)}. (If the model is one of these, "
          "pass logits_fn un-jitted: a cached jax.jit trace bypasses the interception.)")
  require(len(icpt.hits) == 1, f"rankfeat: the forward called {len(icpt.hits)} target blocks "
                               f"({icpt.hits}); one model tower is supported.")
  return z, icpt.family


def rankfeat_scores(logits_fn: Callable, images, *, temperature: float, stages: Sequence[int],
                    vit_block: int, accelerate: bool, iterations: int):
  """s = T logsumexp(mean_k z_k / T), z_k = logits with the rank-1 component removed after
  stage k (ResNet family; the stages' logits averaged) or after one encoder block (ViT)."""
  modify = functools.partial(remove_rank1, accelerate=accelerate, iterations=iterations)
  z, family = modified_logits(logits_fn, images, stage=stages[0], vit_block=vit_block,
                              modify=modify)
  zs = [fc(z)]
  if family != "vit":
    zs += [fc(modified_logits(logits_fn, images, stage=s, vit_block=vit_block,
                              modify=modify)[0]) for s in stages[1:]]
  return energy(sum(zs[1:], zs[0]) / len(zs), temperature)


class RankFeat(Detector):
  """RankFeat (Song et al. NeurIPS 2022; official code and OpenOOD v1.5's rankfeat
  postprocessor): remove sigma_1 u_1 v_1^T from a late feature map (per image, SVD of the
  [positions, channels] matrix), continue the forward, s = T logsumexp(z / T).
  ResNet / BiT: blocks "3+4" averages the logits of the block-4 and of the block-3 removal
  (block 3: the removal is followed by stage 4), "4" / "3" one of them; ViT: the output of
  encoder block depth + vit_block (-2: official ViT-B/16 form; -1: T2T-ViT form).
  Paper / official code = OpenOOD v1.5: T = 1, blocks "3+4", exact SVD (accelerate=False;
  True: 20 power iterations). Needs the model: `score_inputs(state, logits_fn, images)`
  during extraction; `fit` returns {}."""
  name, needs = "rankfeat", frozenset({"inputs"})
  model_families = MODEL_FAMILIES
  defaults = {"temperature": 1.0, "blocks": "3+4", "vit_block": -2, "accelerate": False,
              "iterations": 20}
  presets = {"openood": {"temperature": 1.0, "blocks": "3+4", "accelerate": False}}

  @classmethod
  def validate(cls, hp):
    check_number("rankfeat", hp, "temperature", lo=0, lo_open=True)
    check_choice("rankfeat", hp, "blocks", tuple(STAGES))
    check_number("rankfeat", hp, "vit_block", hi=0, hi_open=True, integer=True)
    check_bool("rankfeat", hp, "accelerate")
    check_number("rankfeat", hp, "iterations", lo=1, integer=True)

  def score_inputs(self, state: dict, logits_fn: Callable, images, *,
                   input_std: Sequence[float] = (1.0,)) -> jax.Array:
    """Scores [B] for NHWC `images` (normalised as the model expects); `logits_fn(images) ->
    logits` must apply a supported Flax model when called (jittable). `input_std` is unused
    (the pipeline passes it to every input scorer)."""
    del state, input_std
    require(jnp.ndim(images) == 4,
            f"rankfeat: images must be NHWC, got shape {jnp.shape(images)}.")
    hp = self.hparams
    fn = functools.partial(rankfeat_scores, logits_fn, temperature=float(hp["temperature"]),
                           stages=STAGES[hp["blocks"]], vit_block=int(hp["vit_block"]),
                           accelerate=bool(hp["accelerate"]), iterations=int(hp["iterations"]))
    if not isinstance(images, jax.core.Tracer):   # inside the caller's jit it is traced as is
      fn = jax.jit(fn)
    return fn(jnp.asarray(images))

  def score(self, state, outputs):
    raise ValueError("rankfeat modifies a late feature map inside the model: use "
                     "det.score_inputs(state, logits_fn, images) during extraction; "
                     "score(state, outputs) cannot compute it.")

  def _score(self, state, features, logits):
    raise ValueError("rankfeat: use score_inputs.")
