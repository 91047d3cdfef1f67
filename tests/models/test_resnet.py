"""fi_jax ResNet / BiT ResNetV2 vs torchvision and timm.

Small-width but structurally real reference models (every block type, stem and shortcut
kind) with perturbed BatchNorm / GroupNorm statistics are written in their real file formats
(torch.save .pth for torchvision, safetensors for timm), loaded through `load()`, and compared
on logits and pre_logits at two input sizes (80 px makes odd feature maps, exercising the
ceil-mode average-pool shortcut). The full-size key sets and shapes are checked on the meta
device.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import resnet, resnetv2
from fi_jax.models.convert import resnet as convert_resnet
from fi_jax.models.convert import resnetv2 as convert_resnetv2
from tests.helpers.torch_reference import perturb_norms, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
tv_resnet = pytest.importorskip("torchvision.models.resnet")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-4
SIZES = (64, 80)
NUM_CLASSES = 10


def init_shapes(model, size=64):
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, size, size, 3))))["params"]


def images(size, seed=0):
  return np.random.RandomState(seed).randn(2, size, size, 3).astype(np.float32)


def torch_forward(m, x, timm_model):
  """Reference logits and the classifier's input (timm: forward_head(pre_logits=True))."""
  t = torch.tensor(x).permute(0, 3, 1, 2)
  with torch.no_grad():
    if timm_model:
      feats = m.forward_features(t)
      return m.forward_head(feats).numpy(), m.forward_head(feats, pre_logits=True).numpy()
    seen = {}

    def keep_input(mod, inp, out):   # returns None: the output stays as it is
      seen["x"] = inp[0]
    hook = m.fc.register_forward_hook(keep_input)
    logits = m(t)
    hook.remove()
    return logits.numpy(), seen["x"].numpy()


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def assert_matches(model, params, ref, size):
  x = images(size)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = torch_forward(ref, x, hasattr(ref, "forward_head"))
  assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  assert out["pre_logits"].shape == want_pre.shape
  d_logits, d_pre = max_diff(logits, want_logits), max_diff(out["pre_logits"], want_pre)
  assert d_logits < TOL and d_pre < TOL, (d_logits, d_pre)
  return d_logits, d_pre


def flat_shapes(tree):
  return {k: tuple(v.shape) for k, v in checkpoints.flatten(tree).items()}


def meta_state_dict(m):
  """A meta-device model's state dict as zero-stride numpy stand-ins (no memory)."""
  return {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in m.state_dict().items()}


# ----------------------------------------------------------------------------- ResNet

# name: (torchvision constructor kwargs, fi_jax variant + overrides)
TV_CASES = {
    "basic": (dict(block=tv_resnet.BasicBlock, layers=[2, 1, 1, 1]),
              dict(variant="resnet18", depths=(2, 1, 1, 1))),
    "bottleneck": (dict(block=tv_resnet.Bottleneck, layers=[1, 2, 1, 1], width_per_group=16),
                   dict(variant="resnet50", depths=(1, 2, 1, 1), width_per_group=16)),
    "resnext": (dict(block=tv_resnet.Bottleneck, layers=[1, 1, 2, 1], groups=4,
                     width_per_group=4),
                dict(variant="resnext50_32x4d", depths=(1, 1, 2, 1), groups=4,
                     width_per_group=4)),
}

# name: (timm model + overrides, fi_jax variant + overrides)
_SMALL = dict(channels=(16, 24, 32, 40), stem_width=8)
_SMALL_FI = dict(widths=(16, 24, 32, 40), stem_width=8)
TIMM_CASES = {
    "resnet50": (dict(model_name="resnet50", layers=(1, 2, 1, 1), channels=(16, 24, 32, 40)),
                 dict(variant="resnet50", depths=(1, 2, 1, 1), widths=(16, 24, 32, 40))),
    "resnet50d": (dict(model_name="resnet50d", layers=(1, 2, 1, 2), **_SMALL),
                  dict(variant="resnet50d", depths=(1, 2, 1, 2), **_SMALL_FI)),
    "resnet18d": (dict(model_name="resnet18d", layers=(1, 1, 2, 1), **_SMALL),
                  dict(variant="resnet18d", depths=(1, 1, 2, 1), **_SMALL_FI)),
    "resnext50d_tiered": (dict(model_name="resnext50d_32x4d", layers=(1, 1, 1, 1),
                               cardinality=4, stem_type="deep_tiered", **_SMALL),
                          dict(variant="resnext50d_32x4d", depths=(1, 1, 1, 1), groups=4,
                               stem="deep_tiered", **_SMALL_FI)),
    "seresnext26t": (dict(model_name="seresnext26t_32x4d", layers=(1, 1, 1, 1), cardinality=4,
                          **_SMALL),
                     dict(variant="seresnext26t_32x4d", depths=(1, 1, 1, 1), groups=4,
                          **_SMALL_FI)),
}

# paths the other cases cover too (groups=1 / 7x7 timm stem); SE: one compile of its own
SLOW = ("bottleneck", "resnet50", "seresnext26t")
_CACHE = {}


def _resnet_case(kind, name, tmp_path_factory):
  """(ref model, fi_jax model, loaded params), built once per case."""
  if (kind, name) not in _CACHE:
    torch.manual_seed(0)
    if kind == "tv":
      ref_kw, fi_kw = TV_CASES[name]
      ref = perturb_norms(tv_resnet.ResNet(num_classes=NUM_CLASSES, **ref_kw))
      path = save_state_dict(ref, tmp_path_factory.mktemp("tv") / "resnet.pth")
    else:
      ref_kw, fi_kw = TIMM_CASES[name]
      ref = perturb_norms(timm.create_model(pretrained=False, num_classes=NUM_CLASSES, **ref_kw))
      path = save_state_dict(ref, tmp_path_factory.mktemp("timm") / "model.safetensors")
    model = resnet.Model(NUM_CLASSES, **fi_kw)
    _CACHE[kind, name] = (ref, model, resnet.load(init_shapes(model), path), path)
  return _CACHE[kind, name]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(TV_CASES)])
def test_resnet_matches_torchvision(name, size, tmp_path_factory):
  ref, model, params, _ = _resnet_case("tv", name, tmp_path_factory)
  assert_matches(model, params, ref, size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(TIMM_CASES)])
def test_resnet_matches_timm(name, size, tmp_path_factory):
  ref, model, params, _ = _resnet_case("timm", name, tmp_path_factory)
  assert_matches(model, params, ref, size)


def test_resnet_bfloat16(tmp_path_factory):
  ref, model, params, _ = _resnet_case("timm", "resnet18d", tmp_path_factory)
  x = images(64)
  logits, out = jax.jit(model.clone(dtype="bfloat16").apply)({"params": params}, x)
  want, want_pre = torch_forward(ref, x, True)
  assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  scale = float(np.max(np.abs(want)))
  assert max_diff(logits, want) < 0.05 * scale + 0.05
  assert max_diff(out["pre_logits"], want_pre) < 0.05 * float(np.max(np.abs(want_pre))) + 0.05


def test_resnet_without_head_drops_fc(tmp_path_factory):
  """num_classes=None loads a classifier file without its fc, the rest unchanged."""
  _, model, params, path = _resnet_case("tv", "basic", tmp_path_factory)
  p = resnet.load(init_shapes(model.clone(num_classes=None)), path)
  want = {k: v for k, v in checkpoints.flatten(params).items() if not k.startswith("head/")}
  got = checkpoints.flatten(p)
  assert sorted(got) == sorted(want)
  assert all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("edit", ["missing", "shape", "unexpected"])
def test_resnet_bad_checkpoint(edit, tmp_path_factory, tmp_path):
  ref, model, _, _ = _resnet_case("tv", "resnext", tmp_path_factory)
  sd = {k: v.clone() for k, v in ref.state_dict().items()}
  key = "layer2.0.downsample.1.running_var"
  if edit == "missing":
    del sd[key]
    want = "layer2_0/downsample_bn/var"
  elif edit == "shape":
    sd["layer1.0.conv2.weight"] = torch.zeros(3, 3, 3, 3)
    want = "layer1_0/conv2/kernel"
  else:
    sd["layer1.0.se.fc1.weight"] = torch.zeros(4, 4, 1, 1)
    want = "layer1.0.se.fc1.weight"
  path = str(tmp_path / "bad.pth")
  torch.save(sd, path)
  with pytest.raises(checkpoints.CheckpointError, match=want) as e:
    resnet.load(init_shapes(model), path)
  assert path in str(e.value)


@pytest.mark.parametrize("source,name", [("torchvision", "resnet50"), ("timm", "resnet50d"),
                                         ("torchvision", "resnext101_64x4d"),
                                         ("timm", "resnet18d")])
def test_resnet_full_size_keys(source, name):
  """The published architectures' state-dict names / shapes are what the converter and the
  Flax init expect (meta device: no memory, no forward)."""
  with torch.device("meta"):
    if source == "torchvision":
      ref = getattr(tv_resnet, name)()
    else:
      ref = timm.create_model(name, pretrained=False)
  flat = convert_resnet.convert(meta_state_dict(ref), source=name)
  assert flat_shapes(flat) == flat_shapes(init_shapes(resnet.Model(1000, variant=name), 224))


def test_resnet_pretrained_table():
  for tag, cfg in resnet.PRETRAINED.items():
    assert cfg["variant"] in resnet.ARCHS, tag
    assert tag.startswith(cfg["source"] + "/") and cfg["pp"].startswith("decode_pil|")
  assert resnet.PRETRAINED["torchvision/resnet50.IMAGENET1K_V2"]["pp"] == (
      "decode_pil|resize_torchvision(232, 'bilinear')|central_crop_torchvision(224)|"
      "normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))")


# ----------------------------------------------------------------------------- BiT ResNetV2

# timm's _create_resnetv2_bit arguments (stem_type='fixed', StdConv2d eps=1e-8) with a small
# depth / width; GroupNorm keeps its 32 groups (channels 128 / 256 after width_factor 2).
BIT_SMALL = dict(layers=[1, 2, 1, 1], channels=(64, 64, 128, 128), width_factor=2, stem_chs=16)


@pytest.fixture(scope="module")
def bit_case(tmp_path_factory):
  from timm.layers import StdConv2d
  from timm.models.resnetv2 import ResNetV2
  torch.manual_seed(0)
  ref = perturb_norms(ResNetV2(num_classes=NUM_CLASSES, stem_type="fixed",
                         conv_layer=functools.partial(StdConv2d, eps=1e-8), **BIT_SMALL))
  path = save_state_dict(ref, tmp_path_factory.mktemp("bit") / "model.safetensors")
  model = resnetv2.Model(NUM_CLASSES, variant="resnetv2_50x1_bit", depths=(1, 2, 1, 1),
                         channels=(64, 64, 128, 128), width_factor=2, stem_width=16)
  return ref, model, resnetv2.load(init_shapes(model), path), path


@pytest.mark.parametrize("size", SIZES)
def test_bit_matches_timm(bit_case, size):
  ref, model, params, _ = bit_case
  assert_matches(model, params, ref, size)


@pytest.mark.slow   # bf16 convs compile slowly on CPU; test_resnet_bfloat16 covers the path
def test_bit_bfloat16(bit_case):
  ref, model, params, _ = bit_case
  x = images(64)
  logits, out = jax.jit(model.clone(dtype="bfloat16").apply)({"params": params}, x)
  want, want_pre = torch_forward(ref, x, True)
  assert logits.dtype == jnp.float32 and out["pre_logits"].dtype == jnp.float32
  assert max_diff(logits, want) < 0.05 * float(np.max(np.abs(want))) + 0.05
  assert max_diff(out["pre_logits"], want_pre) < 0.05 * float(np.max(np.abs(want_pre))) + 0.05


@pytest.mark.parametrize("edit", ["missing", "shape"])
def test_bit_bad_checkpoint(bit_case, edit, tmp_path):
  ref, model, _, _ = bit_case
  sd = {k: v.clone().contiguous() for k, v in ref.state_dict().items()}
  if edit == "missing":
    del sd["stages.1.blocks.0.downsample.conv.weight"]
    want = "stage1_0/downsample_conv/kernel"
  else:
    sd["head.fc.weight"] = torch.zeros(NUM_CLASSES + 1, 256, 1, 1)
    want = "head/kernel"
  path = str(tmp_path / "bad.safetensors")
  safetensors_torch.save_file(sd, path)
  with pytest.raises(checkpoints.CheckpointError, match=want):
    resnetv2.load(init_shapes(model), path)


def test_bit_full_size_keys():
  """resnetv2_50x1_bit as timm builds it: key names / shapes, and the eps / stem the Flax
  defaults assume."""
  with torch.device("meta"):
    ref = timm.create_model("resnetv2_50x1_bit", pretrained=False)
  model = resnetv2.Model(1000, variant="resnetv2_50x1_bit")
  assert ref.stem.conv.eps == model.ws_eps and ref.norm.eps == model.gn_eps
  assert ref.norm.num_groups == model.groups and "pad" in dict(ref.stem.named_children())
  flat = convert_resnetv2.convert(meta_state_dict(ref), source="resnetv2_50x1_bit")
  assert flat_shapes(flat) == flat_shapes(init_shapes(model, 224))


def test_bit_pretrained_table():
  for tag, cfg in resnetv2.PRETRAINED.items():
    assert cfg["variant"] in resnetv2.ARCHS and cfg["source"] == "timm", tag
  cfg = resnetv2.PRETRAINED["timm/resnetv2_50x1_bit.goog_in21k_ft_in1k"]
  assert cfg["input_size"] == 448 and cfg["pp"] == (
      "decode_pil|resize_timm(448, 1.0, 'bilinear', 'center')|central_crop_torchvision(448)|"
      "normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))")
