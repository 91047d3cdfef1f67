"""timm's distilled DeiT (`deit_*_distilled_patch16_*`, timm `deit.py`
VisionTransformerDistilled) through `zoo.from_pretrained`: class + distillation tokens, the two
heads averaged at eval. A narrow random timm model (7x7 patch grid) saved as safetensors gives
timm's logits, timm's pre_logits ((cls + dist) / 2: the mean of fi_jax's [cls | dist] halves)
and both normalised tokens within 1e-4; the stacked head is the pipeline's `Head`."""
import jax
import numpy as np
import pytest

from fi_jax.models import vit, zoo
from fi_jax.models._checkpoints import CheckpointError
from tests.helpers.torch_reference import randomize_params

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

WIDTH, CLASSES = 32, 10


@pytest.mark.slow
def test_distilled_deit_matches_timm(tmp_path):
  torch.manual_seed(0)
  ref = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, patch_size=32,
                          embed_dim=WIDTH, depth=2, num_heads=2, num_classes=CLASSES)
  ref = randomize_params(ref, 0, is_scale=lambda n, p: n.endswith("weight") and p.ndim == 1
                         and "norm" in n).eval()
  path = str(tmp_path / "deit_distilled.safetensors")
  safetensors_torch.save_file(ref.state_dict(), path)
  model, params, info = zoo.from_pretrained(
      "timm/deit_tiny_distilled_patch16_224", path, patch_size=(32, 32), width=WIDTH, depth=2,
      num_heads=2, mlp_dim=4 * WIDTH, num_classes=CLASSES)
  assert info["family"] == "vit" and params["head"]["kernel"].shape == (2 * WIDTH, CLASSES)
  x = np.random.default_rng(1).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32)
  with torch.no_grad():
    feats = ref.forward_features(torch.from_numpy(x).permute(0, 3, 1, 2))
    want_pre = ref.forward_head(feats, pre_logits=True).numpy()
    want_logits = ref.forward_head(feats).numpy()
    feats = feats.numpy()
  logits, out = jax.jit(model.apply)({"params": params}, x)
  pre = np.asarray(out["pre_logits"])
  np.testing.assert_allclose(pre[:, :WIDTH], feats[:, 0], atol=1e-4, rtol=0)
  np.testing.assert_allclose(pre[:, WIDTH:], feats[:, 1], atol=1e-4, rtol=0)
  np.testing.assert_allclose((pre[:, :WIDTH] + pre[:, WIDTH:]) / 2, want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(logits), want_logits, atol=1e-4, rtol=0)
  # the Head contract: logits = pre_logits @ w + b with the stacked head
  np.testing.assert_allclose(pre @ np.asarray(params["head"]["kernel"])
                             + np.asarray(params["head"]["bias"]), want_logits, atol=1e-4)
  # a plain ViT built from the same file refuses the distillation token
  plain = vit.Model(CLASSES, variant="deit_tiny_patch16_224", patch_size=(32, 32), width=WIDTH,
                    depth=2, num_heads=2, mlp_dim=4 * WIDTH)
  init = jax.eval_shape(plain.init, jax.random.PRNGKey(0), np.zeros((1, 224, 224, 3)))["params"]
  with pytest.raises(CheckpointError, match=r"'dist_token'.*unexpected"):
    vit.load(init, path)
