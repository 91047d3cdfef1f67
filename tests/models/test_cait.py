"""fi_jax.models.cait vs timm's Cait: a tiny random timm model (width 32, 1 talking-heads
block, 2 class-attention blocks, the real structure otherwise) saved as safetensors and as an
official-style .pth (`{"model": ...}` with `module.` prefixes), loaded through
`zoo.from_pretrained` and compared on logits and pre-logits."""
import jax
import numpy as np
import pytest
import torch

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import cait, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

timm = pytest.importorskip("timm")

NAME = "cait_xxs24_224.fb_dist_in1k"


def test_matches_timm(tmp_path):
  torch.manual_seed(0)
  ref = randomize_params(timm.create_model("cait_xxs24_224", pretrained=False, embed_dim=32,
                                           depth=1, num_heads=4, num_classes=10), seed=1)
  paths = [save_state_dict(ref, tmp_path / "model.safetensors"), str(tmp_path / "cait.pth")]
  torch.save({"model": {f"module.{k}": v for k, v in ref.state_dict().items()}}, paths[1])
  x = np.random.default_rng(0).normal(size=(2, 224, 224, 3)).astype(np.float32)
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    want_logits, want_pre = ref.forward_head(feats).numpy(), ref.forward_head(
        feats, pre_logits=True).numpy()
  loaded = [zoo.from_pretrained(f"timm/{NAME}", p, num_classes=10, width=32, depth=1,
                                num_heads=4, mlp_hidden=128)[:2] for p in paths]
  jax.tree.map(np.testing.assert_array_equal, loaded[0][1], loaded[1][1])
  model, params = loaded[0]
  logits, out = jax.jit(model.apply)({"params": params}, x)
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_errors(tmp_path):
  ref = timm.create_model("cait_xxs24_224", pretrained=False, embed_dim=32, depth=1,
                          num_heads=4, num_classes=10)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  with pytest.raises(checkpoints.CheckpointError, match=r"'pos_embed' has shape \(1, 196, 32\)"):
    zoo.from_pretrained("timm/cait_xxs24_384.fb_dist_in1k", path, num_classes=10, width=32,
                        depth=1, num_heads=4, mlp_hidden=128)
  with pytest.raises(ValueError, match="Unknown CaiT variant"):
    cait.Model(variant="cait_xxs12_224")
