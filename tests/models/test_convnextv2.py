"""fi_jax ConvNeXt V2 vs timm's ConvNeXt V2 (GRN, no layer scale).

Narrow but structurally complete timm models (4 stages, widths 8..64, depths 1-1-2-1) with
every parameter moved off its trivial init (GRN weight / bias start at zero: a dropped GRN
would not show otherwise) are saved as timm safetensors, as a .pth of the official
facebookresearch/ConvNeXt-V2 layout (`{"model": ...}`, downsample_layers.* / stages.<i>.<j>.*
/ grn.gamma (1, 1, 1, C)), and with the small models' 1x1-conv MLP (`conv_mlp=True`,
atto..nano), and compared on logits and pre_logits. The full-size key layout is checked
against timm's real architectures on torch's meta device.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import convnextv2, zoo
from tests.helpers.torch_reference import nchw, perturb_scaled, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

DEPTHS, DIMS, CLASSES = (1, 1, 2, 1), (8, 16, 32, 64), 10
TOL = 1e-4


def _timm(conv_mlp=False, seed=0):
  torch.manual_seed(seed)
  m = timm.create_model("convnextv2_tiny", pretrained=False, depths=DEPTHS, dims=DIMS,
                        num_classes=CLASSES, conv_mlp=conv_mlp)
  return perturb_scaled(m, seed, special=lambda n, r: 0.5 * r if ".grn." in n else None)


def _official(sd):
  """timm's keys -> the official ConvNeXt-V2 checkpoint's (the inverse of timm's
  convnext.checkpoint_filter_fn), wrapped as the released files are."""
  out = {}
  for k, v in sd.items():
    k = k.replace("stem.", "downsample_layers.0.")
    k = re.sub(r"stages\.(\d+)\.downsample\.", r"downsample_layers.\1.", k)
    k = re.sub(r"stages\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.\2.", k)
    k = k.replace("conv_dw", "dwconv").replace("mlp.fc", "pwconv")
    k = k.replace("mlp.grn.weight", "grn.gamma").replace("mlp.grn.bias", "grn.beta")
    k = k.replace("head.norm.", "norm.").replace("head.fc.", "head.")
    out[k] = v.reshape(1, 1, 1, -1) if ".grn." in k else v
  return {"model": out}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  d = tmp_path_factory.mktemp("convnextv2")
  linear, conv = _timm(), _timm(conv_mlp=True, seed=1)
  torch.save(_official(linear.state_dict()), d / "convnextv2_official.pt")
  return {"timm": (linear, save_state_dict(linear, d / "model.safetensors")),
          "official": (linear, str(d / "convnextv2_official.pt")),
          "timm_conv_mlp": (conv, save_state_dict(conv, d / "conv_mlp.pth"))}


def _init(model, res):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


def _fi(num_classes=CLASSES, **kw):
  return convnextv2.Model(num_classes, variant="convnextv2_tiny", depths=DEPTHS, dims=DIMS, **kw)


def _reference(m, x):
  with torch.no_grad():
    feats = m.forward_features(nchw(x))
    return m.forward_head(feats).numpy(), m.forward_head(feats, pre_logits=True).numpy()


MODEL = _fi()
APPLY = jax.jit(MODEL.apply)   # one compilation for the three layouts (ConvNeXt has no
                               # resolution-dependent code path)


@pytest.mark.parametrize("source", ["timm", "official", "timm_conv_mlp"])
def test_matches_timm(ckpts, source):
  ref, path = ckpts[source]
  params = convnextv2.load(_init(MODEL, 64), path)
  assert "layer_scale" not in params["stage0_block0"] and "grn" in params["stage0_block0"]
  x = np.random.default_rng(len(source)).normal(size=(2, 64, 64, 3)).astype(np.float32)
  logits, out = APPLY({"params": params}, x)
  want_logits, want_pre = _reference(ref, x)
  assert out["pre_logits"].shape == (2, DIMS[-1])
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=TOL, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=TOL, rtol=0)


def test_errors_name_the_file_key(ckpts, tmp_path):
  ref, _ = ckpts["timm"]
  sd = dict(ref.state_dict())
  del sd["stages.2.blocks.1.mlp.grn.bias"]
  path = str(tmp_path / "missing.pth")
  torch.save(sd, path)
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"'stages\.2\.blocks\.1\.mlp\.grn\.bias' is missing"):
    convnextv2.load(_init(_fi(), 64), path)
  with pytest.raises(ValueError, match="Unknown ConvNeXt V2 variant"):
    convnextv2.Model(variant="convnext_tiny")


@pytest.mark.parametrize("variant", ["convnextv2_atto", "convnextv2_tiny"])
def test_full_size_layout(variant):
  with torch.device("meta"):
    shapes = {k: tuple(v.shape) for k, v in
              timm.create_model(variant, pretrained=False).state_dict().items()}
  init = _init(convnextv2.Model(1000, variant=variant), 224)
  sd = {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
  params = convnextv2.convnext.convert.convert(sd, init, file=variant)
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_zoo_entries():
  info = zoo.resolve("timm/convnextv2_tiny")
  assert info["family"] == "convnextv2" and info["name"].endswith(".fcmae_ft_in22k_in1k")
  assert info["input_size"] == 224 and "'bicubic'" in info["pp"]
  assert zoo.resolve("timm/convnextv2_huge.fcmae_ft_in22k_in1k_512")["input_size"] == 512
