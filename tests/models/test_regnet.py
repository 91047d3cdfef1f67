"""fi_jax RegNet vs torchvision's RegNetX / RegNetY.

Small-width torchvision RegNets (real structure: SE or not, grouped 3x3s, projection
shortcuts, identity blocks) with perturbed BatchNorm statistics are saved with torch.save,
loaded through `regnet.load`, and compared on logits and pre_logits at two input sizes. The
variant table is checked against torchvision's BlockParams and the full-size regnet_y_16gf /
regnet_x_400mf key sets and shapes on the meta device.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import regnet
from fi_jax.models.convert import regnet as convert_regnet
from tests.helpers.torch_reference import perturb_norms

torch = pytest.importorskip("torch")
tv_regnet = pytest.importorskip("torchvision.models.regnet")

TOL = 1e-4
NUM_CLASSES = 10

CASES = {   # name: (BlockParams kwargs, stem width)
    "y": (dict(depths=[1, 2, 1, 1], widths=[16, 24, 32, 48], group_widths=[8, 8, 8, 16],
               se_ratio=0.25), 16),
    "x": (dict(depths=[1, 1, 2, 1], widths=[16, 32, 32, 48], group_widths=[8, 16, 8, 24],
               se_ratio=None), 8),
}


def _init(model, size=64):
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, size, size, 3))))["params"]


def _images(size):
  return np.random.RandomState(0).randn(2, size, size, 3).astype(np.float32)


def _diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _ref_forward(m, x):
  seen = {}

  def keep_input(mod, inp, out):   # returns None: the output stays as it is
    seen["x"] = inp[0]
  hook = m.fc.register_forward_hook(keep_input)
  with torch.no_grad():
    logits = m(torch.tensor(x).permute(0, 3, 1, 2))
  hook.remove()
  return logits.numpy(), seen["x"].numpy()


_CACHE = {}


def _case(name, tmp_path_factory):
  if name not in _CACHE:
    bp_kw, stem = CASES[name]
    torch.manual_seed(0)
    n = len(bp_kw["depths"])
    bp = tv_regnet.BlockParams(bottleneck_multipliers=[1.0] * n, strides=[2] * n, **bp_kw)
    ref = perturb_norms(tv_regnet.RegNet(bp, num_classes=NUM_CLASSES, stem_width=stem),
                        linear_weights=True)
    path = str(tmp_path_factory.mktemp("regnet") / f"regnet_{name}.pth")
    torch.save(ref.state_dict(), path)
    model = regnet.RegNet(NUM_CLASSES, depths=tuple(bp_kw["depths"]),
                          widths=tuple(bp_kw["widths"]),
                          group_widths=tuple(bp_kw["group_widths"]),
                          se_ratio=bp_kw["se_ratio"], stem_width=stem)
    _CACHE[name] = (ref, model, regnet.load(_init(model), path), path)
  return _CACHE[name]


@pytest.mark.parametrize("size", [64, 96])
@pytest.mark.parametrize("name", sorted(CASES))
def test_regnet_matches_torchvision(name, size, tmp_path_factory):
  ref, model, params, _ = _case(name, tmp_path_factory)
  x = _images(size)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want, want_pre = _ref_forward(ref, x)
  assert logits.dtype == jnp.float32 and out["pre_logits"].shape == want_pre.shape
  d_logits, d_pre = _diff(logits, want), _diff(out["pre_logits"], want_pre)
  assert d_logits < TOL and d_pre < TOL, (d_logits, d_pre)


def test_regnet_bfloat16(tmp_path_factory):
  ref, model, params, _ = _case("y", tmp_path_factory)
  x = _images(64)
  logits, out = jax.jit(model.clone(dtype="bfloat16").apply)({"params": params}, x)
  want, want_pre = _ref_forward(ref, x)
  assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  assert _diff(logits, want) < 0.05 * float(np.max(np.abs(want))) + 0.05
  assert _diff(out["pre_logits"], want_pre) < 0.05 * float(np.max(np.abs(want_pre))) + 0.05


@pytest.mark.parametrize("edit", ["missing", "shape", "unexpected"])
def test_regnet_bad_checkpoint(edit, tmp_path_factory, tmp_path):
  ref, model, _, _ = _case("y", tmp_path_factory)
  sd = {k: v.clone() for k, v in ref.state_dict().items()}
  if edit == "missing":
    del sd["trunk_output.block2.block2-1.f.se.fc1.bias"]
    want = "block2_1/se/fc1/bias"
  elif edit == "shape":
    sd["trunk_output.block3.block3-0.proj.0.weight"] = torch.zeros(3, 3, 1, 1)
    want = "block3_0/proj_conv/kernel"
  else:
    sd["trunk_output.block1.block1-0.f.d.0.weight"] = torch.zeros(3, 3, 1, 1)
    want = "trunk_output.block1.block1-0.f.d.0.weight"
  path = str(tmp_path / "bad.pth")
  torch.save(sd, path)
  with pytest.raises(checkpoints.CheckpointError, match=want) as e:
    regnet.load(_init(model), path)
  assert path in str(e.value)


def _block_params(name):
  """torchvision's BlockParams of a published RegNet (its builder minus the model)."""
  orig = tv_regnet._regnet
  try:
    tv_regnet._regnet = lambda bp, weights, progress, **kw: bp
    return getattr(tv_regnet, name)()
  finally:
    tv_regnet._regnet = orig


def test_regnet_archs_match_torchvision_block_params():
  for name, arch in regnet.ARCHS.items():
    if name in regnet.TIMM_ARCHS:
      continue
    bp = _block_params(name)
    assert tuple(bp.depths) == arch["depths"], name
    assert tuple(bp.widths) == arch["widths"], name
    assert tuple(bp.group_widths) == arch["group_widths"], name
    assert set(bp.bottleneck_multipliers) == {arch.get("bottleneck_multiplier", 1.0)}, name
    assert set(bp.strides) == {2} and bp.se_ratio == arch.get("se_ratio"), name


@pytest.mark.parametrize("name", ["regnet_y_16gf", "regnet_x_400mf"])
def test_regnet_full_size_keys(name):
  bp = _block_params(name)   # computed with real tensors; the model is built on meta
  with torch.device("meta"):
    ref = tv_regnet.RegNet(bp)
  sd = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in ref.state_dict().items()}
  flat = convert_regnet.convert(sd, source=name)
  init = _init(regnet.Model(1000, variant=name), 224)
  shapes = lambda t: {k: tuple(v.shape) for k, v in checkpoints.flatten(t).items()}
  assert shapes(flat) == shapes(init)


def test_regnet_pretrained_table():
  for tag, cfg in regnet.PRETRAINED.items():
    assert cfg["variant"] in regnet.ARCHS and cfg["source"] == tag.split("/")[0], tag
    assert (cfg["variant"] in regnet.TIMM_ARCHS) == (cfg["source"] == "timm"), tag
  swag = regnet.PRETRAINED["torchvision/regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1"]
  assert swag["input_size"] == 384
  assert swag["pp"] == ("decode_pil|resize_torchvision(384, 'bicubic')|"
                        "central_crop_torchvision(384)|normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))")


# ----------------------------------------------------------------------------- timm

def _timm_fields(ref) -> dict:
  """fi_jax RegNet fields read off a timm RegNet module (stage depths, widths, group widths,
  SE)."""
  stages = [list(getattr(ref, f"s{i}").children()) for i in range(1, 5)]
  first = [blocks[0] for blocks in stages]
  return dict(depths=tuple(len(b) for b in stages),
              widths=tuple(b.conv3.conv.out_channels for b in first),
              group_widths=tuple(b.conv2.conv.out_channels // b.conv2.conv.groups for b in first),
              se_ratio=0.25 if hasattr(first[0].se, "fc1") else None,
              stem_width=ref.stem.conv.out_channels)


@pytest.mark.parametrize("se", [0.25, pytest.param(0.0, marks=pytest.mark.slow)])
def test_regnet_matches_timm(se, tmp_path):
  """A small timm RegNet (RegNetCfg: real blocks, SE or not) saved as safetensors -> load ->
  equal logits and pre-logits; the file's layout is read off its keys."""
  from safetensors.torch import save_file
  from timm.models.regnet import RegNet, RegNetCfg
  torch.manual_seed(0)
  cfg = RegNetCfg(depth=6, w0=16, wa=12.0, wm=1.8, group_size=8, se_ratio=se, stem_width=16)
  ref = perturb_norms(RegNet(cfg, num_classes=NUM_CLASSES), linear_weights=True).eval()
  path = str(tmp_path / "model.safetensors")
  save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
  fields = _timm_fields(ref)
  assert len(set(fields["widths"])) > 1 and (fields["se_ratio"] is None) == (se == 0)
  model = regnet.RegNet(NUM_CLASSES, **fields)
  params = regnet.load(_init(model, 32), path)
  x = _images(32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  seen = {}
  hook = ref.head.fc.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))  # -> None
  with torch.no_grad():
    want = ref(torch.tensor(x).permute(0, 3, 1, 2)).numpy()
  hook.remove()
  assert _diff(logits, want) < TOL and _diff(out["pre_logits"], seen["x"].numpy()) < TOL


def test_regnet_timm_missing_key_names_the_files_key(tmp_path):
  from safetensors.torch import save_file
  from timm.models.regnet import RegNet, RegNetCfg
  ref = RegNet(RegNetCfg(depth=6, w0=16, wa=12.0, wm=1.8, group_size=8, se_ratio=0.25,
                         stem_width=16), num_classes=NUM_CLASSES)
  sd = {k: v.contiguous() for k, v in ref.state_dict().items() if k != "s2.b1.conv2.bn.running_var"}
  path = str(tmp_path / "model.safetensors")
  save_file(sd, path)
  model = regnet.RegNet(NUM_CLASSES, **_timm_fields(ref))
  with pytest.raises(checkpoints.CheckpointError, match=r"'s2\.b1\.conv2\.bn\.running_var' "
                     r"\(the model's 'block2_0/b_bn/var'\).*huggingface\.co/timm"):
    regnet.load(_init(model, 32), path)


def _conv(m):
  return m.conv if hasattr(m, "conv") else m   # ConvNormAct or a bare conv (pre-activation)


@pytest.mark.parametrize("name,cfg,size", [
    # RegNetV: pre-activation, SiLU, average-pool shortcuts (regnetv_064)
    ("regnetv_064.ra3_in1k", dict(depth=6, w0=16, wa=12.0, wm=1.8, group_size=8,
                                  stem_width=16), 72),
    # RegNetZ: x4 inverted bottlenecks, no shortcut on shape changes, linear out, final conv
    ("regnetz_040_h.ra3_in1k", dict(depth=6, w0=8, wa=6.0, wm=1.8, group_size=8, stem_width=16,
                                    num_features=64), 64),
])
def test_regnet_v_z_match_timm(name, cfg, size, tmp_path):
  """A small timm RegNetV / RegNetZ (the published config with fewer, narrower blocks) saved
  as safetensors, loaded through zoo.from_pretrained -> equal logits and pre-logits."""
  import timm

  from fi_jax.models import zoo
  from tests.helpers.torch_reference import save_state_dict
  torch.manual_seed(0)
  ref = perturb_norms(timm.create_model(name.split(".")[0], num_classes=NUM_CLASSES, **cfg),
                      linear_weights=True)
  stages = [list(getattr(ref, f"s{i}").children()) for i in range(1, 5)]
  first = [b[0] for b in stages]
  fields = dict(depths=tuple(len(b) for b in stages),
                widths=tuple(_conv(b.conv3).out_channels for b in first),
                group_widths=tuple(_conv(b.conv2).out_channels // _conv(b.conv2).groups
                                   for b in first), stem_width=cfg["stem_width"])
  assert len(set(fields["widths"])) > 1
  if "num_features" in cfg:
    fields["num_features"] = cfg["num_features"]
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model, params, info = zoo.from_pretrained(f"timm/{name}", path, num_classes=NUM_CLASSES,
                                            **fields)
  assert info["family"] == "regnet"
  x = _images(size)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    t = torch.tensor(x).permute(0, 3, 1, 2)
    feats = ref.forward_features(t)
    want, want_pre = ref.forward_head(feats).numpy(), ref.forward_head(feats, True).numpy()
  assert _diff(logits, want) < TOL and _diff(out["pre_logits"], want_pre) < TOL
