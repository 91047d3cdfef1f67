"""fi_jax Swin v1 / v2 vs torchvision's SwinTransformer and timm's swin / swinv2.

Narrow but structurally complete reference models (patch 4, width 16, depths 1-2-2-1 so every
stage after the first has a shifted block, window 4) with every parameter moved off its
trivial init (relative position bias tables, logit scales, LayerNorms, biases) are saved in
each library's real file format, loaded through `swin.load`, and compared on logits and
pre_logits at sizes that exercise padding, odd patch merging, windows larger than the map
(torchvision: shift dropped after padding; timm: window shrunk at construction) and, for timm,
a run-time size other than `img_size`. Full-size key layouts are checked on torch's meta device.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import swin
from tests.helpers.torch_reference import perturb_scaled

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")
tvs = pytest.importorskip("torchvision.models.swin_transformer")

SMALL = dict(embed_dim=16, depths=(1, 2, 2, 1), num_heads=(2, 2, 4, 4), window_size=4)
CLASSES, TOL = 10, 1e-4
VARIANT = {("torchvision", 1): "swin_t", ("torchvision", 2): "swin_v2_t",
           ("timm", 1): "swin_tiny_patch4_window7_224", ("timm", 2): "swinv2_tiny_window8_256"}


def _perturb(m, seed):
  """Logit scales around log(5), some heads above the log(100) clamp; position-bias tables
  0.5 r; the rest as `perturb_scaled`."""
  def special(n, r):
    if "logit_scale" in n:
      return np.log(5.0) + 1.5 * r
    if "relative_position_bias_table" in n:
      return 0.5 * r
    return None
  return perturb_scaled(m, seed, special=special)


def _reference(source, version, img_size=64, seed=0):
  torch.manual_seed(seed)
  if source == "torchvision":
    kw = dict(block=tvs.SwinTransformerBlockV2, downsample_layer=tvs.PatchMergingV2) \
        if version == 2 else {}
    m = tvs.SwinTransformer([4, 4], SMALL["embed_dim"], list(SMALL["depths"]),
                            list(SMALL["num_heads"]), [4, 4], num_classes=CLASSES, **kw)
  else:
    m = timm.create_model(VARIANT[source, version], pretrained=False, img_size=img_size,
                          num_classes=CLASSES, strict_img_size=False, **SMALL)
  return _perturb(m, seed)


def _fi(source, version, num_classes=CLASSES, **kw):
  return swin.Model(num_classes, variant=VARIANT[source, version], **{**SMALL, **kw})


def _init(model, res):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


def _save(m, path, source):
  if source == "timm":
    safetensors_torch.save_file(m.state_dict(), path)
  else:
    torch.save(m.state_dict(), path)
  return path


def _forward(m, x_nhwc, source):
  x = torch.from_numpy(np.transpose(x_nhwc, (0, 3, 1, 2)).copy())
  with torch.no_grad():
    if source == "timm":
      feats = m.forward_features(x)
      return m.forward_head(feats).numpy(), m.forward_head(feats, pre_logits=True).numpy()
    seen = {}
    hook = m.head.register_forward_hook(lambda mod, i, o: seen.update(pre=i[0]))
    logits = m(x)
    hook.remove()
    return logits.numpy(), seen["pre"].numpy()


# (source, version, img_size the model is built for, input size). torchvision accepts any
# size (it pads); timm is built for img_size and run at it and at one other size. One case per
# (source, version) runs by default, the rest are marked slow (each costs a compile).
_FAST = {("torchvision", 1, None, 72), ("torchvision", 2, None, 100), ("timm", 1, 72, 72),
         ("timm", 2, 64, 96)}
CASES = [pytest.param(*c, marks=() if c in _FAST else pytest.mark.slow) for c in
         [(s, v, None, r) for s in ("torchvision",) for v in (1, 2) for r in (64, 72, 100)]
         + [("timm", v, img, r) for v in (1, 2) for img, r in ((64, 64), (72, 72), (64, 96))]]


@pytest.mark.parametrize("source,version,img,res", CASES)
def test_matches_reference(tmp_path, source, version, img, res):
  ref = _reference(source, version, img or 64)
  ext = "safetensors" if source == "timm" else "pth"
  path = _save(ref, str(tmp_path / f"swin.{ext}"), source)
  cfg = dict(variant=VARIANT[source, version], num_classes=CLASSES, **SMALL,
             **({"img_size": img} if img else {}))
  model = swin.Model(**cfg)
  params = swin.load(_init(model, res), path, cfg)
  x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = _forward(ref, x, source)
  assert out["pre_logits"].shape == (2, 8 * SMALL["embed_dim"]) and logits.dtype == jnp.float32
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=TOL, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=TOL, rtol=0)
  print(f"swin v{version} {source} img={img} {res}px max|dlogits|="
        f"{np.abs(logits - want_logits).max():.2e} "
        f"max|dpre|={np.abs(out['pre_logits'] - want_pre).max():.2e}")


@pytest.mark.parametrize("wh,ww", [(7, 7), (4, 4), (3, 5), (2, 1)])
def test_relative_position_buffers(wh, ww):
  """The derived index / v2 coordinates equal the references' buffers."""
  a = tvs.ShiftedWindowAttention(8, [wh, ww], [0, 0], 2)
  np.testing.assert_array_equal(swin.relative_position_index(wh, ww).reshape(-1),
                                a.relative_position_index.numpy())
  from timm.models import swin_transformer as ts
  np.testing.assert_array_equal(swin.relative_position_index(wh, ww),
                                ts.get_relative_position_index(wh, ww).numpy())
  from timm.models import swin_transformer_v2 as ts2
  for pt in ((0, 0), (3, 3)):
    b = ts2.WindowAttention(8, (wh, ww), 2, pretrained_window_size=pt)
    np.testing.assert_allclose(swin.relative_coords_table(wh, ww, pt),
                               b.relative_coords_table[0].numpy(), atol=1e-7)
  if min(wh, ww) > 1:   # torchvision divides by window - 1
    c = tvs.ShiftedWindowAttentionV2(8, [wh, ww], [0, 0], 2)
    np.testing.assert_allclose(swin.relative_coords_table(wh, ww),
                               c.relative_coords_table[0].numpy(), atol=1e-7)


def test_shift_mask_matches_timm():
  from timm.models import swin_transformer as ts
  blk = ts.SwinTransformerBlock(8, (12, 8), num_heads=2, window_size=4, shift_size=2)
  np.testing.assert_array_equal(swin.shift_mask(12, 8, (4, 4), (2, 2)), blk.attn_mask.numpy())


@pytest.mark.slow
def test_bfloat16(tmp_path):
  ref = _reference("timm", 2)
  path = _save(ref, str(tmp_path / "m.safetensors"), "timm")
  x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  bf = _fi("timm", 2, img_size=64, dtype="bfloat16")
  params = swin.load(_init(bf, 64), path)
  got, out = jax.jit(bf.apply)({"params": params}, x)
  want, want_pre = _forward(ref, x, "timm")
  assert got.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  np.testing.assert_allclose(got, want, atol=0.1 * float(np.abs(want).max()))
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=0.1 * float(np.abs(want_pre).max()))


def test_errors_and_headless(tmp_path):
  ref = _reference("torchvision", 2)
  init = _init(_fi("torchvision", 2), 64)
  sd = dict(ref.state_dict())
  del sd["features.3.1.attn.logit_scale"]
  torch.save(sd, tmp_path / "missing.pth")
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"missing\.pth.*'features\.3\.1\.attn\.logit_scale' is missing"):
    swin.load(init, str(tmp_path / "missing.pth"))
  sd = dict(ref.state_dict())
  sd["features.5.0.mlp.0.weight"] = torch.zeros(5, 64)
  torch.save(sd, tmp_path / "shape.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"'features\.5\.0\.mlp\.0\.weight'.*\(5, 64\)"):
    swin.load(init, str(tmp_path / "shape.pth"))
  good = _save(ref, str(tmp_path / "good.pth"), "torchvision")
  # A window-size mismatch is invisible in v2's params; the stored buffers reveal it.
  cfg = dict(variant="swin_v2_t", num_classes=CLASSES, **{**SMALL, "window_size": 3})
  with pytest.raises(checkpoints.CheckpointError, match=r"relative_coords_table|relative_position_index"):
    swin.load(_init(swin.Model(**cfg), 64), good, cfg)
  headless = swin.load(_init(_fi("torchvision", 2, None), 64), good)
  assert "head" not in headless
  with pytest.raises(ValueError, match="Unknown Swin variant"):
    swin.Model(variant="swin_h")


def _meta_shapes(build):
  with torch.device("meta"):
    return {k: tuple(v.shape) for k, v in build().state_dict().items()}


@pytest.mark.parametrize("variant,source", [
    ("swin_t", "torchvision"), ("swin_v2_t", "torchvision"),
    ("swin_tiny_patch4_window7_224", "timm"), ("swinv2_tiny_window8_256", "timm"),
    pytest.param("swinv2_base_window12to16_192to256", "timm", marks=pytest.mark.slow)])
def test_full_size_layout(variant, source):
  """Every key / shape of the real architecture is what the converter expects, and no more
  (torchvision's stored position buffers included; their values are checked in the
  equivalence tests)."""
  import torchvision.models as tvm
  if source == "torchvision":
    build = lambda: getattr(tvm, variant)()
  else:
    build = lambda: timm.create_model(variant, pretrained=False)
  shapes = _meta_shapes(build)
  model = swin.Model(1000, variant=variant)
  size = model.img_size if source == "timm" else 224
  init = _init(model, size)
  sd = {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
  params = swin.convert.convert(sd, init, file=f"{source} {variant}")
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_pretrained_table():
  for name, cfg in swin.PRETRAINED.items():
    assert cfg["variant"] in swin.ARCHS and cfg["source"] in ("torchvision", "timm"), name
    assert cfg["url"].startswith("https://") and "central_crop" in cfg["pp"], name
  assert swin.PRETRAINED["torchvision/swin_t.IMAGENET1K_V1"]["pp"].startswith(
      "decode_pil|resize_torchvision(232, 'bicubic')")
  assert swin.PRETRAINED["timm/swinv2_tiny_window8_256.ms_in1k"]["input_size"] == 256
