"""fi_jax EVA-02 vs timm's Eva (eva02_*): tiny random timm models (width 32, depth 2, patch 14)
saved as safetensors / .pth and compared on logits and pre-logits; the tiny / small layout
(fused qkv, GluMlp) at its RoPE reference grid (4x4), the base / large layout (separate q/k/v,
SwiGLU with sub-LN) at a 6x6 grid with a 4x4 reference grid, i.e. with the RoPE coordinates
rescaled as in timm's 336 / 448 px fine-tunes of the 224 px models."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import eva, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

TINY = dict(width=32, depth=2, num_heads=2, mlp_hidden=int(32 * 4 * 2 / 3), ref_feat_shape=(4, 4))


def _timm(variant, img, seed):
  torch.manual_seed(seed)
  m = timm.create_model(variant, pretrained=False, img_size=img, embed_dim=32, depth=2,
                        num_heads=2, num_classes=10, ref_feat_shape=(4, 4))
  return randomize_params(m, seed)


def _init(model, res):
  h, w = (res, res) if isinstance(res, int) else res
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, h, w, 3)))["params"]


@pytest.mark.parametrize("variant,res,suffix", [
    ("eva02_tiny_patch14_224", 56, "model.safetensors"),
    ("eva02_base_patch14_224", 84, "eva02.pth")])
def test_matches_timm(tmp_path, variant, res, suffix):
  ref = _timm(variant, res, seed=res)
  path = save_state_dict(ref, tmp_path / suffix)
  model = eva.Model(10, variant=variant, **TINY)
  params = eva.load(_init(model, res), path)
  assert ("qkv" in params["blocks_0"]["attn"]) == (variant == "eva02_tiny_patch14_224")
  x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    want_logits, want_pre = ref.forward_head(feats).numpy(), ref.forward_head(
        feats, pre_logits=True).numpy()
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_rope_table_equals_timm():
  from timm.layers.pos_embed_sincos import RotaryEmbeddingCat
  rope = RotaryEmbeddingCat(16, in_pixels=False, feat_shape=(6, 5), ref_feat_shape=(4, 4))
  sin, cos = eva.rope_sin_cos(6, 5, 16, (4, 4))
  want_sin, want_cos = rope.get_embed().chunk(2, -1)
  np.testing.assert_allclose(sin, want_sin.numpy(), atol=1e-6)
  np.testing.assert_allclose(cos, want_cos.numpy(), atol=1e-6)


def test_pos_embed_resampled_as_timm_does(tmp_path):
  """A file saved at a 4x4 grid loaded into a model initialised at 6x6: the posemb is resampled
  as timm's `set_input_size` does (bicubic with antialias, class slot kept); RoPE regrids."""
  ref = _timm("eva02_tiny_patch14_224", 56, seed=0)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model = eva.Model(10, variant="eva02_tiny_patch14_224", **TINY)
  params = eva.load(_init(model, 84), path)
  ref.set_input_size(img_size=(84, 84))
  x = np.random.default_rng(0).normal(size=(2, 84, 84, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    want = ref(nchw(x)).numpy()
  np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)


def test_errors(tmp_path):
  ref = _timm("eva02_tiny_patch14_224", 56, seed=0)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  with pytest.raises(checkpoints.CheckpointError, match=r"pos_embed \(1, 17, 32\) .* not both square"):
    eva.load(_init(eva.Model(10, variant="eva02_tiny_patch14_224", **TINY), (56, 84)), path)
  with pytest.raises(checkpoints.CheckpointError, match=r"'blocks\.0\.attn\.k_proj\.weight' is missing"):
    eva.load(_init(eva.Model(10, variant="eva02_base_patch14_224", **TINY), 56), path)
  with pytest.raises(ValueError, match="Unknown Eva variant"):
    eva.Model(variant="eva02_base_patch16_clip_224")


@pytest.mark.parametrize("variant", ["eva02_tiny_patch14_336", "eva02_base_patch14_448"])
def test_full_size_layout(variant):
  with torch.device("meta"):
    m = timm.create_model(variant, pretrained=False)
  size = m.patch_embed.img_size[0]
  init = _init(eva.Model(1000, variant=variant), size)
  sd = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in m.state_dict().items()}
  params = eva.convert.convert(sd, init, file=variant)
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_zoo_entries():
  info = zoo.resolve("timm/eva02_large_patch14_448")
  assert info["family"] == "eva" and info["input_size"] == 448
  assert info["name"] == "timm/eva02_large_patch14_448.mim_in22k_ft_in22k_in1k"
  assert info["mean"] == (0.48145466, 0.4578275, 0.40821073)
