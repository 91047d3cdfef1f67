"""fi_jax EfficientNet / EfficientNetV2 vs torchvision and timm.

Small but structurally complete reference models (every block kind, strides 1 and 2, kernels 3
and 5, residual and non-residual blocks, SE) with perturbed weights and BatchNorm statistics
are saved in their real file formats (torchvision .pth, timm .safetensors), loaded through
`efficientnet.load`, and compared (logits, pre_logits) at an even and an odd input size; the
even size exercises the tf_ ports' asymmetric TensorFlow "SAME" padding (stride-2 convs pad
(0, 1) there; odd sizes pad symmetrically). Full-size models are
built on the meta device to check the published key / shape set and each block's stride,
residual and the BatchNorm eps against `ARCHS`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _efficientnet_defs as defs
from fi_jax.models import efficientnet
from fi_jax.models.convert import efficientnet as convert

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")
safetensors_torch = pytest.importorskip("safetensors.torch")
from timm.models import efficientnet as timm_eff  # noqa: E402  (after the conftest shim)
from torchvision.models import efficientnet as tv_eff  # noqa: E402

from tests.helpers.torch_reference import perturb_norms

TOL = 1e-4
NUM_CLASSES = 10

# torchvision rows (fused, expand_ratio, kernel, stride, in, out, layers): MBConv expand 1
# ('ds'), MBConv ('ir', k3 / k5, stride 2, residual repeats), FusedMBConv expand 1 with a
# residual ('cn') and expanded ('er').
TV_SMALL = {
    "v1": dict(rows=((0, 1, 3, 1, 16, 8, 1), (0, 6, 3, 2, 8, 16, 2), (0, 4, 5, 2, 16, 24, 2),
                     (0, 6, 3, 1, 24, 32, 1)), last_channel=None, bn_eps=1e-5),
    "v2": dict(rows=((1, 1, 3, 1, 16, 16, 2), (1, 4, 3, 2, 16, 24, 2), (0, 4, 3, 2, 24, 32, 2),
                     (0, 6, 5, 1, 32, 40, 2)), last_channel=64, bn_eps=1e-3),
}
# timm: the library's own generators (its arch defs) at small multipliers.
_TF = dict(bn_eps=1e-3, pad_type="same")
TIMM_SMALL = {   # name: (generator, its kwargs, our family, channel / depth multiplier, tf)
    "efficientnet_b0": (timm_eff._gen_efficientnet, {}, "efficientnet", 0.25, 0.25, False),
    "tf_efficientnet_b0": (timm_eff._gen_efficientnet, _TF, "efficientnet", 0.25, 0.5, True),
    "tf_efficientnetv2_s": (timm_eff._gen_efficientnetv2_s, _TF, "efficientnetv2_s", 0.25, 0.3,
                            True),
    "efficientnetv2_rw_s": (timm_eff._gen_efficientnetv2_s, dict(rw=True), "efficientnetv2_rw",
                            0.25, 0.2, False),
}


def _perturb(m, seed):
  return perturb_norms(m, seed)


def _tv_small(kind, seed=0):
  cfg = TV_SMALL[kind]
  setting = [(tv_eff.FusedMBConvConfig(e, k, s, i, o, n) if fused
              else tv_eff.MBConvConfig(e, k, s, i, o, n)) for fused, e, k, s, i, o, n in cfg["rows"]]
  norm = lambda c: torch.nn.BatchNorm2d(c, eps=cfg["bn_eps"])
  m = tv_eff.EfficientNet(setting, dropout=0.2, num_classes=NUM_CLASSES, norm_layer=norm,
                          last_channel=cfg["last_channel"])
  arch = efficientnet.torchvision_arch(cfg["rows"], last_channel=cfg["last_channel"],
                                       bn_eps=cfg["bn_eps"])
  return _perturb(m, seed), arch


def _timm_small(name, seed=0):
  gen, kw, family, cm, dm, tf = TIMM_SMALL[name]
  torch.manual_seed(seed)
  m = gen(name, channel_multiplier=cm, depth_multiplier=dm, num_classes=NUM_CLASSES, **kw)
  return _perturb(m, seed), efficientnet.timm_arch(family, cm, dm, tf=tf)


def _init(model, res=64):
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3))))[
      "params"]


def _save(m, path, fmt):
  sd = {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}
  if fmt == "safetensors":
    safetensors_torch.save_file(sd, str(path))
  else:
    torch.save(sd, str(path))
  return str(path)


def _ref(m, img):
  with torch.no_grad():
    x = torch.tensor(img).permute(0, 3, 1, 2)
    if hasattr(m, "forward_head"):   # timm
      feats = m.forward_head(m.forward_features(x), pre_logits=True)
    else:
      feats = torch.flatten(m.avgpool(m.features(x)), 1)
    return m(x).numpy(), feats.numpy()


def _compare(m, arch, path, sizes, dtype="float32"):
  model = efficientnet.Model(NUM_CLASSES, dtype=dtype, **arch)
  params = efficientnet.load(_init(model), path)
  apply = jax.jit(model.apply)
  diffs = {}
  for res in sizes:
    img = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
    logits, out = apply({"params": params}, img)
    ref_logits, ref_pre = _ref(m, img)
    assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
    diffs[res] = (float(np.abs(np.asarray(logits) - ref_logits).max()),
                  float(np.abs(np.asarray(out["pre_logits"]) - ref_pre).max()),
                  float(np.abs(ref_logits).max()))
  return diffs


@pytest.mark.parametrize("kind", sorted(TV_SMALL))
def test_torchvision_matches(kind, tmp_path):
  m, arch = _tv_small(kind)
  diffs = _compare(m, arch, _save(m, tmp_path / "tv.pth", "pth"), (64, 47))
  print(f"torchvision {kind}: max |diff| (logits, pre_logits, |ref logits|) per size {diffs}")
  for d_logits, d_pre, _ in diffs.values():
    assert d_logits < TOL and d_pre < TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "efficientnet_b0" else n   # = torchvision v1
    for n in sorted(TIMM_SMALL)])
def test_timm_matches(name, tmp_path):
  m, arch = _timm_small(name)
  diffs = _compare(m, arch, _save(m, tmp_path / "timm.safetensors", "safetensors"), (64, 65))
  print(f"timm {name}: max |diff| (logits, pre_logits, |ref logits|) per size {diffs}")
  for d_logits, d_pre, _ in diffs.values():
    assert d_logits < TOL and d_pre < TOL


def test_tf_same_padding_is_asymmetric(tmp_path):
  """The tf_ port with PyTorch padding must differ (else the tests could not see it). At even
  sizes TF pads stride-2 convs (0, 1), at odd ones symmetrically, as PyTorch does."""
  m, arch = _timm_small("tf_efficientnet_b0")
  path = _save(m, tmp_path / "timm.safetensors", "safetensors")
  model = efficientnet.Model(NUM_CLASSES, **{**arch, "same_pad": False})
  params = efficientnet.load(_init(model), path)
  img = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  logits, _ = jax.jit(model.apply)({"params": params}, img)
  assert np.abs(np.asarray(logits) - _ref(m, img)[0]).max() > 1e-2


@pytest.mark.slow
def test_bfloat16_close_to_float32(tmp_path):
  m, arch = _tv_small("v2")
  path = _save(m, tmp_path / "tv.pth", "pth")
  img = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  outs = {}
  for dtype in ("float32", "bfloat16"):
    model = efficientnet.Model(NUM_CLASSES, dtype=dtype, **arch)
    logits, out = jax.jit(model.apply)({"params": efficientnet.load(_init(model), path)}, img)
    assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
    outs[dtype] = np.asarray(logits)
  scale = np.abs(outs["float32"]).max()
  assert np.abs(outs["bfloat16"] - outs["float32"]).max() < 0.1 * scale


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_missing_wrong_shape_unexpected_keys(fmt, tmp_path):
  m, arch = _tv_small("v1") if fmt == "pth" else _timm_small("tf_efficientnet_b0")
  init = _init(efficientnet.Model(NUM_CLASSES, **arch))
  sd = {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}
  victim = "features.2.1.block.1.0.weight" if fmt == "pth" else "blocks.1.0.conv_dw.weight"
  flax_key = "blocks_1_1/conv_dw/kernel" if fmt == "pth" else "blocks_1_0/conv_dw/kernel"

  def write(d, name):
    path = tmp_path / f"{name}.{fmt}"
    (safetensors_torch.save_file if fmt == "safetensors" else torch.save)(d, str(path))
    return str(path)

  missing = write({k: v for k, v in sd.items() if k != victim}, "missing")
  with pytest.raises(checkpoints.CheckpointError, match=f"missing.*{flax_key}") as e:
    efficientnet.load(init, missing)
  assert missing in str(e.value)
  wrong = write({**sd, victim: torch.zeros(sd[victim].shape[0], 1, 7, 7)}, "wrong")
  with pytest.raises(checkpoints.CheckpointError, match=f"shape.*{flax_key}") as e:
    efficientnet.load(init, wrong)
  assert wrong in str(e.value)
  extra = write({**sd, "bogus.weight": torch.zeros(3)}, "extra")
  with pytest.raises(checkpoints.CheckpointError, match="bogus.weight") as e:
    efficientnet.load(init, extra)
  assert extra in str(e.value)


def test_unknown_layout_and_variant():
  with pytest.raises(checkpoints.CheckpointError, match="neither a timm.*nor a torchvision"):
    convert.convert({"fc.weight": np.zeros((2, 2))})
  with pytest.raises(ValueError, match="Unknown EfficientNet variant 'efficientnet_b9'"):
    efficientnet.Model(variant="efficientnet_b9")


# ----------------------------------------------------------------------------- full size

def _structure_tv(m):
  """(stride, residual) per block and the BN eps set of a torchvision EfficientNet."""
  return [(max(c.stride[0] for c in b.modules() if isinstance(c, torch.nn.Conv2d)),
           bool(b.use_res_connect)) for stage in list(m.features)[1:-1] for b in stage]


def _structure_timm(m):
  """The same for a timm EfficientNet."""
  return [(max(c.stride[0] for c in b.modules() if isinstance(c, torch.nn.Conv2d)),
           bool(b.has_skip)) for stage in m.blocks for b in stage]


def _check_full(variant, ref):
  arch = efficientnet.ARCHS[variant]
  sd = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
  tree = convert.convert(sd)        # source detected from the keys
  init = _init(efficientnet.Model(1000, variant=variant))
  checkpoints.merge_params(tree, init, source=variant)   # every key and shape
  structure = _structure_timm(ref) if arch["source"] == "timm" else _structure_tv(ref)
  assert [(b[2], b[7]) for stage in arch["stages"] for b in stage] == structure
  eps = {mod.eps for mod in ref.modules() if isinstance(mod, torch.nn.BatchNorm2d)}
  assert eps == {arch["bn_eps"]}
  same = any(type(mod).__name__ == "Conv2dSame" for mod in ref.modules())
  assert same == arch["same_pad"]


FULL_FAST = ["efficientnet_b0", "efficientnet_b7", "efficientnet_v2_s", "timm/tf_efficientnet_b0",
             "timm/tf_efficientnetv2_s"]
# the B8 / L2 TF ports differ from B0..B7 only in their multipliers (and are the largest):
# tests/models/test_timm_coverage.py checks their shapes (FI_JAX_TIMM_COVERAGE=efficientnet)
# (the arch-string built timm models: tests/models/test_efficientnet_timm.py)
FULL_SLOW = sorted(set(efficientnet.ARCHS) - set(FULL_FAST)
                   - {"timm/tf_efficientnet_b8", "timm/tf_efficientnet_l2"}
                   - {f"timm/{n}" for n in defs.GENERATORS})


def _reference(variant):
  with torch.device("meta"):
    if variant.startswith("timm/"):
      return timm.create_model(variant[len("timm/"):], pretrained=False)
    return getattr(torchvision.models, variant)()


@pytest.mark.parametrize("variant", FULL_FAST)
def test_full_size_layout(variant):
  _check_full(variant, _reference(variant))


@pytest.mark.slow
@pytest.mark.parametrize("variant", FULL_SLOW)
def test_full_size_layout_all(variant):
  _check_full(variant, _reference(variant))


def test_pretrained_table_matches_libraries():
  for name, cfg in efficientnet.PRETRAINED.items():
    assert efficientnet.ARCHS[cfg["variant"]]["source"] == cfg["source"], name
    lib, _, tag = name.partition("/")
    if lib == "torchvision":
      arch, weights = tag.split(".")
      enum = getattr(tv_eff, next(n for n in dir(tv_eff) if n.lower() == f"{arch}_weights"))
      w = enum[weights]
      t = w.transforms()
      assert cfg["url"] == w.url and cfg["input_size"] == t.crop_size[0], name
      assert (f"resize_torchvision({t.resize_size[0]}, '{t.interpolation.value}')" in cfg["pp"]
              and f"central_crop_torchvision({t.crop_size[0]})" in cfg["pp"]
              and f"normalize({tuple(t.mean)}, {tuple(t.std)})" in cfg["pp"]), name
    else:
      pc = timm.models.get_pretrained_cfg(tag)
      size = pc.input_size[-1]
      assert cfg["input_size"] == size, name
      assert (f"resize_timm({size}, {pc.crop_pct!r}, '{pc.interpolation}', '{pc.crop_mode}')"
              in cfg["pp"] and f"central_crop_torchvision({size})" in cfg["pp"]
              and f"normalize({tuple(pc.mean)}, {tuple(pc.std)})" in cfg["pp"]), name
      assert cfg["url"] == f"https://huggingface.co/{pc.hf_hub_id}/resolve/main/model.safetensors"
