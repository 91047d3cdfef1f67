"""fi_jax.models.vit_timm against timm: relative-position ViTs (per-block and shared
log-coordinate MLP bias, class token, residual post-norm) at two input sizes, the residual
post-norm / differential / parallel ViTs of vision_transformer.py, BEiT-3, timm's test ViTs
(register with posemb, attention-pool head) and the ResNetV2 hybrids: each a randomly
initialised timm model of tiny width with the real structure, saved by torch (.pth or
.safetensors) and loaded through zoo.from_pretrained; logits and pre-logits within 1e-4.
Opt-in (FI_JAX_VIT_TIMM_ALL=1): every architecture at full width against timm in float64."""
import functools
import os

import jax
import numpy as np
import pytest
import timm
import torch

from fi_jax.models import vit_timm, zoo
from fi_jax.models._checkpoints import CheckpointError
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

TINY = dict(embed_dim=32, depth=1, num_heads=2)
# two blocks where a block differs from the first: the differential attention's λ_init
# depends on the block index; the shared relpos bias is computed once for every block
TWO_BLOCKS = ("vit_srelpos_small_patch16_224", "vit_dwee_patch16_reg1_gap_256",
              "vit_dpwee_patch16_reg1_gap_256")


def _is_scale(name, p):
  """LayerNorm / GroupNorm / RmsNorm scales around 1 (LayerScale gammas stay small)."""
  return name.endswith("weight") and p.ndim == 1 and "norm" in name


def _depth(name):
  return 2 if name in TWO_BLOCKS else TINY["depth"]


def _timm(name, seed=0, **kw):
  return randomize_params(timm.create_model(name, pretrained=False, num_classes=10,
                                            **{**TINY, "depth": _depth(name), **kw}),
                          seed, is_scale=_is_scale)


def _images(hw, batch=2, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (batch, *hw, 3)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _jit(model):
  return jax.jit(model.apply)


def _check(model, params, ref, hw, batch=2):
  x = _images(hw, batch)
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    want_pre = ref.forward_head(feats, pre_logits=True).numpy()
    want = ref.forward_head(feats).numpy()
  logits, out = _jit(model)({"params": params}, x)
  np.testing.assert_allclose(np.asarray(out["pre_logits"]), want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(logits), want, atol=1e-4, rtol=0)


def _mlp_dim(name):
  arch = vit_timm.ARCHS[name]
  return int(TINY["embed_dim"] * arch["mlp_dim"] / arch["width"])


# (timm model, file format, input sizes (h, w)): the relpos bias depends on the patch grid,
# so those run at two sizes (one non-square) from one file.
RELPOS = [
    ("vit_relpos_medium_patch16_224", "safetensors", [(64, 64), (48, 80)]),
    ("vit_srelpos_small_patch16_224", "pth", [(80, 48)]),
    ("vit_relpos_medium_patch16_cls_224", "pth", [(48, 80)]),
    ("vit_relpos_base_patch32_plus_rpn_256", "safetensors", [(96, 64)]),
]


@pytest.mark.parametrize("name,ext,sizes", RELPOS, ids=[r[0] for r in RELPOS])
def test_relpos_vits_equal_timm_at_two_input_sizes(tmp_path, name, ext, sizes):
  arch = vit_timm.ARCHS[name]
  rel_pos_dim = {"rel_pos_dim": 16} if arch.get("rel_pos_dim", 128) != 128 else {}
  ref = _timm(name, img_size=sizes[0], **rel_pos_dim)
  model, params = _load_arch(tmp_path, name, ref, ext, **rel_pos_dim)
  for hw in sizes:
    if hw != sizes[0]:
      ref.set_input_size(img_size=hw)
    _check(model, params, ref, hw)


def _load_arch(tmp_path, name, ref, ext, **overrides):
  path = save_state_dict(ref, tmp_path / f"model.{ext}")
  tag = next(n for n in zoo.names() if n.startswith(f"timm/{name}."))
  kw = dict(width=TINY["embed_dim"], depth=_depth(name), num_heads=TINY["num_heads"],
            mlp_dim=_mlp_dim(name), **overrides)
  model, params, info = zoo.from_pretrained(tag, path, num_classes=10, **kw)
  assert info["family"] == "vit_timm"
  return model, params


# vision_transformer.py's residual post-norm and sbb differential / parallel ViTs (absolute
# posemb: at the tag's input size, with 32-pixel patches to stay small)
VIT = [
    ("vit_base_patch16_rpn_224", "pth"),
    ("vit_dwee_patch16_reg1_gap_256", "safetensors"),
    ("vit_pwee_patch16_reg1_gap_256", "pth"),
    ("vit_dpwee_patch16_reg1_gap_256", "safetensors"),
    ("beit3_base_patch16_224", "pth"),
    ("test_vit3", "safetensors"),   # also test_vit2's register with a posemb slot
]


@pytest.mark.parametrize("name,ext", VIT, ids=[v[0] for v in VIT])
def test_vision_transformer_block_variants_equal_timm(tmp_path, name, ext):
  size = zoo.resolve(f"timm/{name}")["input_size"]
  ref = _timm(name, patch_size=32)
  model, params = _load_arch(tmp_path, name, ref, ext, patch_size=32)
  _check(model, params, ref, (size, size))


def test_hybrid_resnet_stem_vit_equals_timm(tmp_path):
  """vit_tiny_r_s16_p8: timm's ResNetV2 'same' stem alone, then an 8x8 patch conv."""
  name = "vit_tiny_r_s16_p8_224"
  ref = _timm(name)
  model, params = _load_arch(tmp_path, name, ref, "safetensors")
  _check(model, params, ref, (224, 224), batch=1)


@pytest.mark.slow
def test_hybrid_resnet_stages_vit_equals_timm(tmp_path):
  """vit_small_r26_s32's structure with two ResNetV2 stages (timm's own `_resnetv2` helper:
  non-pre-activation bottlenecks, StdConv2dSame, GroupNorm) and a 4x4 patch conv."""
  from timm.layers import HybridEmbed
  from timm.models.vision_transformer import VisionTransformer
  from timm.models.vision_transformer_hybrid import _resnetv2
  name = "vit_small_r26_s32_224"
  # what timm's vit_small_r26_s32_224 builds, with two one-block stages
  ref = randomize_params(VisionTransformer(
      img_size=224, patch_size=4, num_classes=10, **TINY,
      embed_layer=functools.partial(HybridEmbed, backbone=_resnetv2(layers=(1, 1)))),
      is_scale=_is_scale)
  model, params = _load_arch(tmp_path, name, ref, "pth", patch_size=4, hybrid_layers=(1, 1))
  _check(model, params, ref, (224, 224), batch=1)


def test_a_file_of_another_structure_names_the_key(tmp_path):
  """A per-block relpos file loaded as the shared-relpos architecture: the error names the
  timm key the model lacks."""
  ref = _timm("vit_relpos_medium_patch16_224", img_size=64)
  with pytest.raises(CheckpointError, match=r"rel_pos\.mlp"):
    _load_arch(tmp_path, "vit_srelpos_medium_patch16_224", ref, "pth")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FI_JAX_VIT_TIMM_ALL"),
                    reason="opt-in (minutes): FI_JAX_VIT_TIMM_ALL=1 compares every vit_timm "
                           "architecture at full width with timm")
@pytest.mark.parametrize("name", sorted(vit_timm.ARCHS))
def test_every_architecture_at_full_width_equals_timm(tmp_path, name):
  """Each ARCHS entry with two blocks and otherwise timm's own configuration (widths, eps,
  pooling, block kind, biases, hybrid backbone) at its tag's input size: the fields the
  parameter shapes do not show (LayerNorm eps, pooling, pre- vs post-norm) included. Against
  timm in float64: within 1e-4, or twice timm's own float32 error where that is larger (the
  R26 / R50 backbones accumulate ~1e-4 in float32, in torch as in JAX)."""
  info = zoo.resolve(f"timm/{name}")
  size = info["input_size"]
  ref = randomize_params(timm.create_model(name, pretrained=False, num_classes=10, depth=2),
                         is_scale=_is_scale)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model, params, _ = zoo.from_pretrained(info["name"], path, num_classes=10, depth=2)
  x = _images((size, size), batch=1)
  with torch.no_grad():
    want32 = ref.forward_head(ref.forward_features(nchw(x)), pre_logits=True).numpy()
    ref.double()
    want = ref.forward_head(ref.forward_features(nchw(x, torch.float64)),
                            pre_logits=True).numpy()
  _, out = _jit(model)({"params": params}, x)
  tol = max(1e-4, 2 * float(np.abs(want32 - want).max()))
  np.testing.assert_allclose(np.asarray(out["pre_logits"]), want, atol=tol, rtol=0)
