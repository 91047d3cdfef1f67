"""fi_jax's Eva port vs timm's `Eva` for the architectures beyond EVA-02: NAVER's RoPE-ViT
(RoPE-Mixed with the absolute posemb end to end; the axial RoPE's tables), timm's SBB RoPE ViTs
with register tokens and EVA-01 giant (`mediumd`'s fused qkv without biases is the path
DINOv3's tests run). Tiny random timm models (width 32, depth 1 or 2, the real structure)
saved as safetensors / .pth and compared on logits and pre-logits: at the zoo's input size
(loaded through `zoo.from_pretrained`) and, for the RoPE models, at a small one too (the RoPE
tables depend on the patch grid; the absolute posemb saved for the zoo's grid is resampled on
load as timm's `set_input_size` / `resample_abs_pos_embed` does)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import eva, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

TINY = dict(width=32, num_heads=2, mlp_hidden=128)


def _reference(ref, x):
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    return ref.forward_head(feats).numpy(), ref.forward_head(feats, pre_logits=True).numpy()


# depth 2 where blocks differ (RoPE-Mixed: per-block frequencies), else 1; the RoPE models at
# two sizes, EVA-01 (no RoPE; its posemb resampling is EVA-02's, tests/models/test_eva.py) at
# the zoo's. NAVER's axial RoPE differs from RoPE-Mixed only in its tables (compared below).
@pytest.mark.parametrize("name,suffix,depth,two_sizes,kw", [
    ("vit_base_patch16_rope_mixed_ape_224.naver_in1k", "rope.pth", 2, True, {}),
    ("vit_betwixt_patch16_rope_reg4_gap_256.sbb_in1k", "model.safetensors", 1, True, {}),
    ("eva_giant_patch14_224.clip_ft_in1k", "giant.pth", 1, False, dict(mlp_ratio=4))])
def test_matches_timm_at_two_sizes(tmp_path, name, suffix, depth, two_sizes, kw):
  variant = name.split(".")[0]
  size, patch = zoo.resolve(f"timm/{name}")["input_size"], eva.ARCHS[variant]["patch_size"]
  torch.manual_seed(0)
  ref = randomize_params(timm.create_model(variant, pretrained=False, embed_dim=32, depth=depth,
                                           num_heads=2, num_classes=10, **kw), seed=1)
  path = save_state_dict(ref, tmp_path / suffix)
  rng = np.random.default_rng(0)
  small = 3 * patch
  for res in (size, small)[:1 + two_sizes]:
    x = rng.normal(size=(2, res, res, 3)).astype(np.float32)
    if res == size:
      model, params, _ = zoo.from_pretrained(f"timm/{name}", path, num_classes=10, depth=depth,
                                             **TINY)
    else:   # the file's posemb (zoo grid) resampled to the small grid, as timm does
      ref.set_input_size(img_size=(small, small))
      shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))
      params = eva.load(shapes["params"], path)
    logits, out = jax.jit(model.apply)({"params": params}, x)
    want_logits, want_pre = _reference(ref, x)
    np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_axial_rope_tables_equal_timms():
  """NAVER's axial RoPE ('xy' grid, temperature 100) on a non-square grid."""
  from timm.layers.pos_embed_sincos import RotaryEmbeddingCat
  rope = RotaryEmbeddingCat(16, temperature=100., in_pixels=False, feat_shape=(3, 5),
                            grid_indexing="xy")
  sin, cos = eva.rope_sin_cos(3, 5, 16, None, 100., "xy")
  want_sin, want_cos = rope.get_embed().chunk(2, -1)
  np.testing.assert_allclose(sin, want_sin.numpy(), atol=1e-6)
  np.testing.assert_allclose(cos, want_cos.numpy(), atol=1e-6)


def test_mixed_rope_tables_equal_timms():
  from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed
  torch.manual_seed(0)
  rope = RotaryEmbeddingMixed(32, depth=2, num_heads=2, feat_shape=(3, 5))
  sin, cos = eva.mixed_rope_sin_cos(rope.freqs.detach().numpy(), 3, 5)
  want_sin, want_cos = rope.get_embed().detach().chunk(2, -1)
  np.testing.assert_allclose(sin, want_sin.numpy(), atol=1e-6)
  np.testing.assert_allclose(cos, want_cos.numpy(), atol=1e-6)


def test_token_pooling_needs_a_class_token():
  model = eva.Model(10, variant="vit_medium_patch16_rope_reg1_gap_256", pool="token", **TINY,
                    depth=1)
  with pytest.raises(ValueError, match="pool='token' needs the class token"):
    jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
