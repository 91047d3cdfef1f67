"""fi_jax BEiT / BEiT v2 vs timm's Beit: a tiny random timm model (width 32, depth 2, patch 8)
saved as safetensors and as a unilm-style `{"model": ...}` .pth with the index buffers,
compared on logits and pre-logits at its own 4x4 patch grid and, with the bias tables
resized on load, at a 6x6 grid against timm's own resize (checkpoint_filter_fn)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import beit, zoo
from fi_jax.models.convert import beit as convert
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

TINY = dict(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8)
TIMM_TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, patch_size=8,
                 num_classes=10)


def _timm(img_size, variant="beitv2_base_patch16_224", seed=0):
  torch.manual_seed(seed)
  m = timm.create_model(variant, pretrained=False, img_size=img_size, **TIMM_TINY)
  return randomize_params(m, seed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("beit")
  ref = _timm(32)
  sd = dict(ref.state_dict())
  for i in range(2):   # unilm files also hold the (non-persistent in timm) index buffers
    sd[f"blocks.{i}.attn.relative_position_index"] = ref.blocks[i].attn.relative_position_index
  torch.save({"model": sd}, d / "beit_unilm.pth")
  return ref, save_state_dict(ref, d / "model.safetensors"), str(d / "beit_unilm.pth")


MODEL = beit.Model(10, variant="beitv2_base_patch16_224", **TINY)
APPLY = jax.jit(MODEL.apply)


def _run(path, res):
  init = jax.eval_shape(MODEL.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]
  params = beit.load(init, path)
  x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
  logits, out = APPLY({"params": params}, x)
  return x, np.asarray(logits), np.asarray(out["pre_logits"])


def _reference(m, x):
  with torch.no_grad():
    feats = m.forward_features(nchw(x))
    return m.forward_head(feats).numpy(), m.forward_head(feats, pre_logits=True).numpy()


@pytest.mark.parametrize("which", [1, 2])
def test_matches_timm_at_the_native_grid(files, which):
  ref, path = files[0], files[which]
  x, logits, pre = _run(path, 32)
  want_logits, want_pre = _reference(ref, x)
  np.testing.assert_allclose(pre, want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_bias_tables_resized_as_timm_at_another_grid(files):
  ref, path, _ = files
  big = _timm(48, seed=5)
  big.load_state_dict(timm.models.beit.checkpoint_filter_fn(ref.state_dict(), big))
  x, logits, pre = _run(path, 48)
  want_logits, want_pre = _reference(big.eval(), x)
  np.testing.assert_allclose(pre, want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_index_and_errors(files, tmp_path):
  ref = files[0]
  np.testing.assert_array_equal(convert.relative_position_index(4, 4),
                                ref.blocks[0].attn.relative_position_index.numpy())
  sd = dict(ref.state_dict())
  sd["blocks.0.attn.relative_position_index"] = torch.zeros(17, 17, dtype=torch.long)
  torch.save(sd, tmp_path / "bad_index.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"relative_position_index.*differs"):
    _run(str(tmp_path / "bad_index.pth"), 32)
  del sd["blocks.1.gamma_2"]
  torch.save(sd, tmp_path / "missing.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"'blocks\.1\.gamma_2' is missing"):
    _run(str(tmp_path / "missing.pth"), 32)


@pytest.mark.parametrize("variant", ["beit_base_patch16_384"])
def test_full_size_layout(variant):
  with torch.device("meta"):
    m = timm.create_model(variant, pretrained=False)
  size = m.patch_embed.img_size[0]
  init = jax.eval_shape(beit.Model(1000, variant=variant).init, jax.random.PRNGKey(0),
                        jnp.zeros((1, size, size, 3)))["params"]
  sd = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in m.state_dict().items()}
  params = convert.convert(sd, init, file=variant)
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_zoo_normalisation_differs_between_versions():
  v1, v2 = zoo.resolve("timm/beit_base_patch16_224"), zoo.resolve("timm/beitv2_base_patch16_224")
  assert v1["family"] == v2["family"] == "beit"
  assert v1["mean"] == (0.5, 0.5, 0.5) and v2["mean"] == (0.485, 0.456, 0.406)
  assert zoo.resolve("timm/beit_large_patch16_512")["input_size"] == 512
