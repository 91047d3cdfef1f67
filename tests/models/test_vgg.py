"""fi_jax VGG vs timm's VGG (timm `models/vgg.py`: features, the ConvMlp pre-logits, pooled
head) through `zoo.from_pretrained`: a narrow random timm model with real structure (vgg11_bn's
layer pattern, BatchNorm statistics randomised) saved as safetensors, logits and pre-logits
within 1e-4 at 64 px (a 2x2 map adaptive-pooled up to 7x7) and 256 px (8x8 map: the 7x7 fc1
conv slides to 2x2, then the pool)."""
import jax
import numpy as np
import pytest

from fi_jax.extract import layer_columns
from fi_jax.models import vgg, zoo
from fi_jax.models._checkpoints import CheckpointError
from tests.helpers.torch_reference import perturb_scaled

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

CFG = (8, "M", 16, "M", 16, 16, "M", 24, 24, "M", 24, 24, "M")   # vgg11's pattern, narrow
HIDDEN, CLASSES = 32, 10


def _timm_vgg(seed=0):
  torch.manual_seed(seed)
  from timm.models.vgg import VGG
  m = VGG(list(CFG), num_classes=CLASSES, norm_layer=torch.nn.BatchNorm2d)
  # the 4096-wide ConvMlp made narrow, the head following it
  m.pre_logits.fc1 = torch.nn.Conv2d(24, HIDDEN, 7)
  m.pre_logits.fc2 = torch.nn.Conv2d(HIDDEN, HIDDEN, 1)
  m.head.fc = torch.nn.Linear(HIDDEN, CLASSES)
  m = perturb_scaled(m, seed)
  g = torch.Generator().manual_seed(seed)
  for mod in m.modules():
    if isinstance(mod, torch.nn.BatchNorm2d):
      mod.running_mean.copy_(0.5 * torch.randn(mod.num_features, generator=g))
      mod.running_var.copy_(0.5 + torch.rand(mod.num_features, generator=g))
  return m.eval()


@pytest.mark.slow
def test_vgg_bn_matches_timm(tmp_path):
  ref = _timm_vgg()
  path = str(tmp_path / "vgg.safetensors")
  safetensors_torch.save_file(ref.state_dict(), path)
  model, params, info = zoo.from_pretrained("timm/vgg11_bn", path, cfg=CFG, hidden=HIDDEN,
                                            num_classes=CLASSES)
  assert info["family"] == "vgg" and "features_1" in params   # the BatchNorm after conv 0
  apply = jax.jit(model.apply)
  for res in (64, 256):
    x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
    with torch.no_grad():
      feats = ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
      want_pre = ref.forward_head(feats, pre_logits=True).numpy()
      want = ref.forward_head(feats).numpy()
    logits, out = apply({"params": params}, x)
    np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0, err_msg=res)
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0, err_msg=res)
  # the layer detectors read the stage maps
  assert list(layer_columns.blocks(out)) == [f"stage{i}" for i in range(5)]
  # a file without BatchNorm does not fit the _bn model: named by its key
  sd = {k: v for k, v in ref.state_dict().items() if not k.startswith("features.1.")}
  safetensors_torch.save_file(sd, str(tmp_path / "no_bn.safetensors"))
  with pytest.raises(CheckpointError, match=r"'features\.1\.(weight|bias)' is missing"):
    vgg.load(params, str(tmp_path / "no_bn.safetensors"))


def test_adaptive_pool_windows():
  """torch's adaptive windows (overlapping when growing 2 -> 7, 5 -> 3)."""
  x = np.random.default_rng(0).normal(size=(1, 5, 2, 3)).astype(np.float32)
  got = vgg.adaptive_avg_pool(x, (3, 7))
  want = torch.nn.functional.adaptive_avg_pool2d(
      torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), (3, 7)).numpy().transpose(0, 2, 3, 1)
  np.testing.assert_allclose(got, want, atol=1e-6)
