"""fi_jax.models.xcit vs timm's Xcit: tiny random timm models (width 32, 1 XCA block, the real
structure otherwise: convolutional stem with BatchNorm, Fourier encoding, LPI, class-attention
blocks) at patch 16 with `tokens_norm` and patch 8 without (nano), saved as safetensors and as
an official-style .pth (`pos_embeder`, fused class-attention qkv), loaded through
`zoo.from_pretrained` (initialised at 224 px: no parameter depends on the input size) and
compared on logits and pre-logits at other sizes (the Fourier encoding follows the grid; it is
compared with timm's on a non-square grid)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fi_jax.models import xcit, zoo
from tests.helpers.torch_reference import nchw, perturb_norms, randomize_params, save_state_dict

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("name,official,res", [("xcit_small_12_p16_224.fb_in1k", False, 96),
                                               ("xcit_nano_12_p8_224.fb_dist_in1k", True, 40)])
def test_matches_timm(tmp_path, name, official, res):
  variant = name.split(".")[0]
  torch.manual_seed(0)
  ref = timm.create_model(variant, pretrained=False, embed_dim=32, depth=1, num_heads=4,
                          num_classes=10)
  ref = perturb_norms(randomize_params(ref, seed=1), seed=2)
  if official:
    sd = {}
    for k, v in ref.state_dict().items():
      k = k.replace("pos_embed.", "pos_embeder.")
      if ".attn.q." in k and k.startswith("cls_attn_blocks"):
        sd[k.replace(".attn.q.", ".attn.qkv.")] = torch.cat(
            [ref.state_dict()[k.replace(".attn.q.", f".attn.{n}.")] for n in "qkv"])
      elif not (k.startswith("cls_attn_blocks") and (".attn.k." in k or ".attn.v." in k)):
        sd[k] = v
    path = str(tmp_path / "xcit.pth")
    torch.save({"model": sd}, path)
  else:
    path = save_state_dict(ref, tmp_path / "model.safetensors")
  model, params, _ = zoo.from_pretrained(f"timm/{name}", path, num_classes=10, width=32,
                                         depth=1, num_heads=4, mlp_hidden=128)
  x = np.random.default_rng(0).normal(size=(2, res, res, 3)).astype(np.float32)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))
  assert jax.tree.map(np.shape, shapes["params"]) == jax.tree.map(np.shape, params)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    want_logits, want_pre = ref.forward_head(feats).numpy(), ref.forward_head(
        feats, pre_logits=True).numpy()
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_fourier_features_equal_timms():
  from timm.models.xcit import PositionalEncodingFourier
  enc = PositionalEncodingFourier(dim=64)
  with torch.no_grad():
    enc.token_projection.weight.copy_(torch.eye(64).reshape(64, 64, 1, 1))
    enc.token_projection.bias.zero_()
    want = enc(1, 3, 5)[0].permute(1, 2, 0).numpy()
  np.testing.assert_allclose(xcit.fourier_features(3, 5), want, atol=1e-6)
