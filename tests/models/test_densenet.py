"""fi_jax DenseNet vs timm's DenseNet (timm `models/densenet.py`) through
`zoo.from_pretrained`: narrow random timm models with the real structure (four dense blocks,
transitions; densenet121's stem and densenetblur121d's deep stem with the blur pool), BatchNorm
statistics randomised, saved as safetensors; logits and pre-logits within 1e-4."""
import jax
import numpy as np
import pytest

from fi_jax.extract import layer_columns
from fi_jax.models import densenet, zoo
from fi_jax.models._checkpoints import CheckpointError
from tests.helpers.torch_reference import perturb_scaled

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

SMALL = dict(growth_rate=8, block_config=(1, 2, 1, 1))
CLASSES = 10


def _timm(name, seed):
  torch.manual_seed(seed)
  m = perturb_scaled(timm.create_model(name, pretrained=False, num_classes=CLASSES, **SMALL),
                     seed)
  g = torch.Generator().manual_seed(seed)
  for mod in m.modules():
    if isinstance(mod, torch.nn.BatchNorm2d):
      mod.running_mean.copy_(0.5 * torch.randn(mod.num_features, generator=g))
      mod.running_var.copy_(0.5 + torch.rand(mod.num_features, generator=g))
  return m.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["densenet121", "densenetblur121d"])
def test_matches_timm(tmp_path, name):
  ref = _timm(name, seed=len(name))
  path = str(tmp_path / f"{name}.safetensors")
  safetensors_torch.save_file(ref.state_dict(), path)
  model, params, info = zoo.from_pretrained(f"timm/{name}", path, num_classes=CLASSES, **SMALL)
  assert info["family"] == "densenet"
  x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
  with torch.no_grad():
    feats = ref.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
    want_pre = ref.forward_head(feats, pre_logits=True).numpy()
    want = ref.forward_head(feats).numpy()
  logits, out = jax.jit(model.apply)({"params": params}, x)
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)
  # the layer detectors read the stage maps
  assert list(layer_columns.blocks(out)) == ["stem", "stage0", "stage1", "stage2", "stage3"]


def test_blur_pool_matches_timm():
  from timm.layers import BlurPool2d
  x = np.random.default_rng(1).normal(size=(2, 7, 6, 3)).astype(np.float32)
  with torch.no_grad():
    want = BlurPool2d(3, stride=2)(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
  np.testing.assert_allclose(densenet.blur_pool(x), want.transpose(0, 2, 3, 1), atol=1e-6)


def test_wrong_growth_rate_names_the_key(tmp_path):
  ref = _timm("densenet121", 0)
  path = str(tmp_path / "d.safetensors")
  safetensors_torch.save_file(ref.state_dict(), path)
  model = densenet.Model(CLASSES, variant="densenet121", growth_rate=4,
                         block_config=SMALL["block_config"])
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, 64, 64, 3)))["params"]
  with pytest.raises(CheckpointError, match=r"features\.conv0\.weight"):
    densenet.load(init, path)
