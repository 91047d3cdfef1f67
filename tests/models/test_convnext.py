"""fi_jax ConvNeXt vs torchvision's and timm's ConvNeXt.

Narrow but structurally complete reference models (4 stages, widths 8..64, depths 1-1-2-1) with
every parameter moved off its trivial init (layer scales, LayerNorms, biases) are saved in each
library's real file format (.pth state dict / timm safetensors), loaded through
`convnext.load`, and compared on logits and pre_logits at two input sizes. The full-size key
layout is checked against the real architectures on torch's meta device.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import convnext
from tests.helpers.torch_reference import perturb_scaled

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")
tv_convnext = pytest.importorskip("torchvision.models.convnext")

DEPTHS, DIMS, CLASSES = (1, 1, 2, 1), (8, 16, 32, 64), 10
TOL = 1e-4


def _perturb(m, seed):
  """Layer scales 0.5 r (their init is 1e-6: a wrong map would not show), the rest as
  `perturb_scaled`."""
  return perturb_scaled(m, seed, special=lambda n, r: 0.5 * r
                        if n.endswith(("layer_scale", "gamma")) else None)


def _torchvision(seed=0):
  torch.manual_seed(seed)
  cfg = [tv_convnext.CNBlockConfig(d, DIMS[i + 1] if i + 1 < len(DIMS) else None, n)
         for i, (d, n) in enumerate(zip(DIMS, DEPTHS))]
  return _perturb(tv_convnext.ConvNeXt(cfg, num_classes=CLASSES), seed)


def _timm(seed=1):
  torch.manual_seed(seed)
  m = timm.create_model("convnext_tiny", pretrained=False, depths=DEPTHS, dims=DIMS,
                        num_classes=CLASSES)
  return _perturb(m, seed)


def _init(model, res):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


def _fi(num_classes=CLASSES, **kw):
  return convnext.Model(num_classes, variant="convnext_tiny", depths=DEPTHS, dims=DIMS, **kw)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  d = tmp_path_factory.mktemp("convnext")
  tv, tm = _torchvision(), _timm()
  torch.save(tv.state_dict(), d / "tv.pth")
  safetensors_torch.save_file(tm.state_dict(), str(d / "timm.safetensors"))
  return {"torchvision": (tv, str(d / "tv.pth")), "timm": (tm, str(d / "timm.safetensors"))}


def _reference(m, x_nhwc, source):
  x = torch.from_numpy(np.transpose(x_nhwc, (0, 3, 1, 2)).copy())
  with torch.no_grad():
    if source == "timm":
      feats = m.forward_features(x)
      pre = m.forward_head(feats, pre_logits=True)
      logits = m.forward_head(feats)
    else:
      seen = {}
      hook = m.classifier[2].register_forward_hook(lambda mod, i, o: seen.update(pre=i[0]))
      logits = m(x)
      hook.remove()
      pre = seen["pre"]
  return logits.numpy(), pre.numpy()


@pytest.mark.parametrize("source", ["torchvision", "timm"])
@pytest.mark.parametrize("res", [64, 80])
def test_matches_reference(ckpts, source, res):
  ref, path = ckpts[source]
  model = _fi()
  params = convnext.load(_init(model, 64), path)
  x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = _reference(ref, x, source)
  assert out["pre_logits"].shape == (2, DIMS[-1]) and logits.dtype == jnp.float32
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=TOL, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=TOL, rtol=0)
  print(f"convnext {source} {res}px max|dlogits|={np.abs(logits - want_logits).max():.2e} "
        f"max|dpre|={np.abs(out['pre_logits'] - want_pre).max():.2e}")


@pytest.mark.slow
def test_conv_mlp_matches_timm(tmp_path):
  """timm's conv_mlp ConvNeXts (atto..nano: LayerNorm2d + the MLP as 1x1 convs) load onto
  the same module: equal logits and pre-logits."""
  torch.manual_seed(2)
  ref = _perturb(timm.create_model("convnext_atto", pretrained=False, depths=DEPTHS, dims=DIMS,
                                   num_classes=CLASSES), 2)
  assert ref.stages[0].blocks[0].mlp.fc1.weight.ndim == 4
  path = str(tmp_path / "atto.safetensors")
  safetensors_torch.save_file(ref.state_dict(), path)
  model = convnext.Model(CLASSES, variant="convnext_atto", depths=DEPTHS, dims=DIMS)
  params = convnext.load(_init(model, 64), path)
  x = np.random.default_rng(3).normal(size=(2, 64, 64, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = _reference(ref, x, "timm")
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=TOL, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=TOL, rtol=0)


def test_source_from_config_and_headless(ckpts):
  _, path = ckpts["timm"]
  model = _fi(None)
  params = convnext.load(_init(model, 64), path, {"source": "timm"})
  assert "head" not in params
  with pytest.raises(checkpoints.CheckpointError, match=r"'stem\.0\.weight' is missing"):
    convnext.load(_init(model, 64), ckpts["torchvision"][1], {"source": "timm"})


@pytest.mark.slow
def test_bfloat16(ckpts):
  ref, path = ckpts["timm"]
  x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  bf = _fi(dtype="bfloat16")
  params = convnext.load(_init(bf, 64), path)
  got, out = jax.jit(bf.apply)({"params": params}, x)
  want, want_pre = _reference(ref, x, "timm")
  assert got.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  np.testing.assert_allclose(got, want, atol=0.1 * float(np.abs(want).max()))
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=0.1 * float(np.abs(want_pre).max()))


def test_errors(ckpts, tmp_path):
  tv, _ = ckpts["torchvision"]
  init = _init(_fi(), 64)
  sd = dict(tv.state_dict())
  del sd["features.3.0.layer_scale"]
  torch.save(sd, tmp_path / "missing.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"features\.3\.0\.layer_scale.*missing\.pth|missing\.pth.*features\.3\.0\.layer_scale"):
    convnext.load(init, str(tmp_path / "missing.pth"))
  sd = dict(tv.state_dict())
  sd["features.5.1.block.3.weight"] = torch.zeros(7, 32)
  torch.save(sd, tmp_path / "shape.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"features\.5\.1\.block\.3\.weight.*\(7, 32\)"):
    convnext.load(init, str(tmp_path / "shape.pth"))
  sd = dict(tv.state_dict())
  sd["features.9.weight"] = torch.zeros(3)
  torch.save(sd, tmp_path / "extra.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"unexpected key 'features\.9\.weight'"):
    convnext.load(init, str(tmp_path / "extra.pth"))
  with pytest.raises(ValueError, match="Unknown ConvNeXt variant"):
    convnext.Model(variant="convnext_huge")


def _meta_sd(build):
  with torch.device("meta"):
    return {k: tuple(v.shape) for k, v in build().state_dict().items()}


@pytest.mark.parametrize("variant", ["convnext_tiny",
                                     pytest.param("convnext_large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("source", ["torchvision", "timm"])
def test_full_size_layout(variant, source):
  """Every key / shape of the real architecture is what the converter expects, and no more."""
  import torchvision.models as tvm
  build = (lambda: getattr(tvm, variant)()) if source == "torchvision" else (
      lambda: timm.create_model(variant, pretrained=False))
  shapes = _meta_sd(build)
  init = _init(convnext.Model(1000, variant=variant), 224)
  sd = {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
  params = convnext.convert.convert(sd, init, file=f"{source} {variant}")
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_pretrained_table():
  for name, cfg in convnext.PRETRAINED.items():
    assert cfg["variant"] in convnext.ARCHS and cfg["source"] in ("torchvision", "timm", "fb"), name
    assert cfg["url"].startswith("https://") and "central_crop" in cfg["pp"], name
  assert "resize_torchvision(236, 'bilinear')" in convnext.PRETRAINED[
      "torchvision/convnext_tiny.IMAGENET1K_V1"]["pp"]
  assert convnext.PRETRAINED["timm/convnext_base.fb_in22k_ft_in1k"]["num_classes"] == 1000
  official = convnext.PRETRAINED["dinov3/dinov3_convnext_large.lvd1689m"]
  assert official["num_classes"] == 0 and official["source"] == "fb"
  assert official["url"].endswith("dinov3_convnext_large_pretrain_lvd1689m-61fa432d.pth")


def _dinov3_official(seed=4):
  from tests.helpers.dinov3_convnext_reference import DinoV3ConvNeXt
  torch.manual_seed(seed)
  return _perturb(DinoV3ConvNeXt(DEPTHS, DIMS), seed).eval()


@pytest.mark.slow
def test_dinov3_official_file_matches_official_code(tmp_path):
  """An official DINOv3 ConvNeXt file (bare state dict, `norms.3.*` repeating `norm.*`) through
  `zoo.from_pretrained`: headless, pre_logits = logits = the official `x_norm_clstoken`; timm's
  converted layout (`convnext_tiny.dinov3_lvd1689m`, num_classes 0) gives the same numbers."""
  from fi_jax.models import zoo
  ref = _dinov3_official()
  sd = ref.state_dict()
  assert "norms.3.weight" in sd and not any(k.startswith("head.") for k in sd)
  torch.save(sd, tmp_path / "dinov3_convnext.pth")
  x = np.random.default_rng(5).normal(size=(2, 64, 64, 3)).astype(np.float32)
  with torch.no_grad():
    want = ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
  want = want["x_norm_clstoken"].numpy()
  model, params, info = zoo.from_pretrained("dinov3/dinov3_convnext_tiny",
                                            str(tmp_path / "dinov3_convnext.pth"),
                                            depths=DEPTHS, dims=DIMS)
  assert info["url"].endswith("dinov3_convnext_tiny_pretrain_lvd1689m-21b726bb.pth")
  assert "head" not in params and info["input_size"] == 224
  apply = jax.jit(model.apply)
  logits, out = apply({"params": params}, x)
  np.testing.assert_allclose(out["pre_logits"], want, atol=TOL, rtol=0)
  np.testing.assert_allclose(logits, want, atol=TOL, rtol=0)
  # timm's layout of the same weights (timm's own fb -> timm remap), timm's name
  tm = timm.create_model("convnext_tiny", pretrained=False, depths=DEPTHS, dims=DIMS,
                         num_classes=0)
  tm.load_state_dict(timm.models.convnext.checkpoint_filter_fn(sd, tm))
  safetensors_torch.save_file(tm.state_dict(), str(tmp_path / "timm.safetensors"))
  with torch.no_grad():
    want_timm = tm(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
  np.testing.assert_allclose(want_timm, want, atol=TOL, rtol=0)
  timm_model, params, _ = zoo.from_pretrained("timm/convnext_tiny.dinov3_lvd1689m",
                                              str(tmp_path / "timm.safetensors"),
                                              depths=DEPTHS, dims=DIMS)
  assert timm_model == model   # the same module: the compiled forward serves both
  logits, out = apply({"params": params}, x)
  np.testing.assert_allclose(logits, want, atol=TOL, rtol=0)


def test_dinov3_norm_alias_must_repeat_norm(tmp_path):
  sd = dict(_dinov3_official().state_dict())
  sd["norms.3.bias"] = sd["norms.3.bias"] + 1
  torch.save(sd, tmp_path / "bad.pth")
  model = _fi(None)
  with pytest.raises(checkpoints.CheckpointError, match=r"'norms\.3\.bias' is not a copy"):
    convnext.load(_init(model, 64), str(tmp_path / "bad.pth"))


# timm's ConvNeXt options through real timm names (narrow widths), two models covering them
# all: an overlapping stem with an activation, SimpleNorm everywhere (the head's too), the MLP
# head, per-stage kernels, SiLU (convnext_zepto_rms_ols + convnext_large_mlp's /
# test_convnext3's options); a tiered overlapping stem, head_norm_first, tanh GELU, eps 1e-5
# (convnext_atto_ols + convnext_tiny_hnf's / test_convnext's options).
# {name: (timm kwargs, fi_jax kwargs)}
_OPTION_CASES = {
    "convnext_zepto_rms_ols": (
        dict(head_hidden_size=24, kernel_sizes=(7, 5, 5, 3), act_layer="silu"),
        dict(head_hidden=24, kernel_sizes=(7, 5, 5, 3), act="silu")),
    "convnext_atto_ols": (
        dict(head_norm_first=True, act_layer="gelu_tanh", norm_eps=1e-5),
        dict(head_norm_first=True, act="gelu_tanh", eps=1e-5)),
}


@pytest.mark.slow
def test_timm_options_match_timm(tmp_path):
  from fi_jax.models import zoo
  depths, dims = (1, 1, 1, 1), (16, 24, 32, 40)
  x = np.random.default_rng(6).normal(size=(2, 32, 32, 3)).astype(np.float32)
  for seed, (name, (timm_kw, fi_kw)) in enumerate(_OPTION_CASES.items()):
    torch.manual_seed(seed)
    ref = _perturb(timm.create_model(name, pretrained=False, depths=depths, dims=dims,
                                     **timm_kw), seed)
    path = str(tmp_path / f"{name}.safetensors")
    safetensors_torch.save_file(ref.state_dict(), path)
    model, params, _ = zoo.from_pretrained(f"timm/{name}", path, depths=depths, dims=dims,
                                           **fi_kw)
    assert ("norm_pre" in params) == ("head_norm_first" in fi_kw)
    assert ("head_hidden" in params) == ("head_hidden" in fi_kw)
    logits, out = jax.jit(model.apply)({"params": params}, x)
    want_logits, want_pre = _reference(ref, x, "timm")
    np.testing.assert_allclose(out["pre_logits"], want_pre, atol=TOL, rtol=0, err_msg=name)
    np.testing.assert_allclose(logits, want_logits, atol=TOL, rtol=0, err_msg=name)
