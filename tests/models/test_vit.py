"""ViT: big_vision npz round trips (all layouts) and equivalence with timm via safetensors."""
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import vit
from fi_jax.models.convert import readers
from tests.helpers.torch_reference import randomize_params

TINY = dict(patch_size=(8, 8), width=32, depth=2, mlp_dim=64, num_heads=4)
IMG = (2, 32, 32, 3)


def _init(res=32, **kw):
  model = vit.Model(**{**TINY, **kw})
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]
  # Random non-zero values everywhere (init zeros the head and cls), so a wrong map shows.
  flat = ckpt.flatten(params)
  rng = np.random.default_rng(1)
  flat = {k: (rng.normal(size=np.shape(v)) * 0.2).astype(np.float32) for k, v in flat.items()}
  return model, ckpt.recover_tree(flat)


def _images(shape=IMG, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


_JITTED = {}


def _apply(model, params, x):
  """Jitted apply, compiled once per model config."""
  fn = _JITTED.setdefault(repr(model), jax.jit(model.apply))
  with jax.default_matmul_precision("highest"):
    return fn({"params": params}, x)


@pytest.mark.parametrize("pool,posemb,rep", [("tok", "learn", False), ("gap", "sincos2d", True),
                                             ("map", "learn", False), ("none", "learn", False)])
def test_pools_and_outputs(pool, posemb, rep):
  nc = None if pool == "none" else 5
  model, params = _init(num_classes=nc, pool_type=pool, posemb=posemb, rep_size=rep)
  logits, out = _apply(model, params, _images())
  if pool == "none":
    assert logits.shape == (2, 16, 32)
    return
  assert logits.shape == (2, 5) and out["pre_logits"].shape == (2, 32)
  assert out["pre_logits_2d"].shape == (2, 4, 4, 32)
  np.testing.assert_allclose(
      logits, out["pre_logits"] @ params["head"]["kernel"] + params["head"]["bias"], atol=1e-5)


def test_scan_equals_unrolled(tmp_path):
  model, params = _init(num_classes=5, pool_type="map")
  smodel = vit.Model(5, **TINY, pool_type="map", scan=True)
  sinit = jax.eval_shape(smodel.init, jax.random.PRNGKey(1), jnp.zeros((1, 32, 32, 3)))["params"]
  assert sinit["Transformer"]["encoderblock"]["LayerNorm_0"]["scale"].shape == (2, 32)
  path = str(tmp_path / "unrolled.npz")
  readers.save_npz(path, params)
  sparams = vit.load(sinit, path)
  np.testing.assert_allclose(_apply(smodel, sparams, _images())[0],
                             _apply(model, params, _images())[0], atol=1e-5)
  # ...and back: a scanned file into the unrolled model.
  spath = str(tmp_path / "scanned.npz")
  readers.save_npz(spath, sparams)
  back = vit.load(params, spath)
  for k, v in ckpt.flatten(params).items():
    np.testing.assert_array_equal(ckpt.flatten(back)[k], v)


def _bf16_params_file(tree, path):
  """big_vision release layout: 'params/' prefix, bfloat16 arrays (stored as |V2 by numpy)."""
  flat = {f"params/{k}": np.asarray(v).astype(ml_dtypes.bfloat16) for k, v in ckpt.flatten(tree).items()}
  np.savez(path, **flat)
  with np.load(path) as z:
    assert z[next(iter(z.files))].dtype.str == "|V2"


def test_bfloat16_params_prefix_and_subkey(tmp_path):
  model, params = _init(num_classes=5, pool_type="gap")
  path = str(tmp_path / "bf16.npz")
  _bf16_params_file({"img": params, "t": np.zeros(1)}, path)
  for name in (path, path + ":img"):
    loaded = vit.load(params, name)
    assert loaded["embedding"]["kernel"].dtype == np.float32
    want = np.asarray(params["embedding"]["kernel"]).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(loaded["embedding"]["kernel"], want)
  got = _apply(model, loaded, _images())[0]
  np.testing.assert_allclose(got, _apply(model, params, _images())[0], atol=0.1)


def _pre_linen(params):
  """AugReg / original-ViT file layout: shared module counter, posemb with cls slot in Transformer."""
  p = jax.tree.map(np.asarray, params)
  enc = p["Transformer"]
  for name in [k for k in enc if k.startswith("encoderblock_")]:
    b = enc[name]
    enc[name] = {"LayerNorm_0": b["LayerNorm_0"], "MultiHeadDotProductAttention_1":
                 b["MultiHeadDotProductAttention_0"], "LayerNorm_2": b["LayerNorm_1"],
                 "MlpBlock_3": b["MlpBlock_0"]}
  cls_pe = np.random.default_rng(3).normal(size=(1, 1, 32)).astype(np.float32)
  enc["posembed_input"] = {"pos_embedding": np.concatenate([cls_pe, p.pop("pos_embedding")], 1)}
  p["cls"] = p["cls"] - cls_pe
  return p


def test_pre_linen_augreg_names(tmp_path):
  model, params = _init(num_classes=5, pool_type="tok")
  path = str(tmp_path / "augreg.npz")
  readers.save_npz(path, _pre_linen(params))
  with np.load(path) as z:
    assert "Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel" in z.files
    assert z["Transformer/posembed_input/pos_embedding"].shape == (1, 17, 32)
  loaded = vit.load(params, path)
  np.testing.assert_allclose(_apply(model, loaded, _images())[0],
                             _apply(model, params, _images())[0], atol=1e-5)


def test_posemb_resample_and_dont_load(tmp_path):
  _, params = _init(num_classes=5, pool_type="gap")
  path = str(tmp_path / "p.npz")
  readers.save_npz(path, params)
  model48, init48 = _init(res=48, num_classes=7, pool_type="gap")
  loaded = vit.load(init48, path, dont_load=["head/.*"])
  assert loaded["pos_embedding"].shape == (1, 36, 32)
  np.testing.assert_array_equal(loaded["head"]["kernel"], init48["head"]["kernel"])
  # Linear zoom keeps the corners of the grid.
  old = np.asarray(params["pos_embedding"]).reshape(4, 4, 32)
  np.testing.assert_allclose(loaded["pos_embedding"].reshape(6, 6, 32)[0, 0], old[0, 0], atol=1e-6)
  assert _apply(model48, loaded, _images((1, 48, 48, 3)))[0].shape == (1, 7)


def test_clear_errors(tmp_path):
  _, params = _init(num_classes=5, pool_type="tok")
  with pytest.raises(FileNotFoundError, match="gs://vit_models/augreg/B_16-i21k"):
    vit.load(params, "howto-i21k-B/16")
  _, other = _init(num_classes=5, pool_type="tok", mlp_dim=48)
  path = str(tmp_path / "vit_s16_i1k_300ep.npz")
  readers.save_npz(path, other)
  with pytest.raises(ValueError, match=r"MlpBlock_0/Dense_0/bias.*\(48,\).*\(64,\).*gs://big_vision/vit_s16_i1k_300ep.npz"):
    vit.load(params, path)


# ----------------------------------------------------------------------------- timm


def _save_torch(module, path):
  from safetensors.torch import save_file
  save_file({k: v.contiguous() for k, v in module.state_dict().items()}, path)


@pytest.mark.parametrize("pool,layerscale", [("token", None), ("map", None), ("token", 1e-5)])
def test_timm_equivalence(tmp_path, pool, layerscale):
  """timm ViT (AugReg: cls slot in pos_embed; SigLIP-style MAP; DeiT-3-style LayerScale with
  no_embed_class) -> safetensors -> fi_jax loader; exact GELU via act='gelu_exact'."""
  torch = pytest.importorskip("torch")
  timm_vit = pytest.importorskip("timm.models.vision_transformer")
  ref = timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                   mlp_ratio=2.0, num_classes=5, global_pool=pool,
                                   class_token=pool == "token", init_values=layerscale,
                                   no_embed_class=layerscale is not None)
  randomize_params(ref)
  path = str(tmp_path / "model.safetensors")
  _save_torch(ref, path)
  model = vit.Model(5, **TINY, pool_type="tok" if pool == "token" else "map", act="gelu_exact",
                    layerscale=layerscale)
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]
  params = vit.load(init, path)
  x = _images()
  with torch.no_grad():
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    feats = ref.forward_head(ref.forward_features(xt), pre_logits=True).numpy()
    logits = ref(xt).numpy()
  got_logits, out = _apply(model, params, x)
  np.testing.assert_allclose(np.asarray(out["pre_logits"]), feats, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(got_logits), logits, atol=1e-4, rtol=0)


def test_timm_fc_norm_needs_the_option(tmp_path):
  """A timm fc_norm checkpoint (global avg pool) loads only into a model with fc_norm=True;
  without it the error names the fc_norm tensors."""
  pytest.importorskip("torch")
  timm_vit = pytest.importorskip("timm.models.vision_transformer")
  ref = timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                   mlp_ratio=2.0, num_classes=5, global_pool="avg",
                                   class_token=False)
  path = str(tmp_path / "model.safetensors")
  _save_torch(ref, path)
  _, params = _init(num_classes=5, pool_type="gap")
  with pytest.raises(ckpt.CheckpointError, match="fc_norm"):
    vit.load(params, path)
  _, params = _init(num_classes=5, pool_type="gap", fc_norm=True)
  loaded = vit.load(params, path)
  np.testing.assert_array_equal(loaded["fc_norm"]["scale"], ref.fc_norm.weight.detach().numpy())


def test_safetensors_reader_bf16(tmp_path):
  torch = pytest.importorskip("torch")
  from safetensors.torch import save_file
  t = torch.randn(3, 5).to(torch.bfloat16)
  path = str(tmp_path / "x.safetensors")
  save_file({"a": t, "b": torch.arange(4)}, path)
  flat = readers.load_safetensors(path)
  np.testing.assert_array_equal(flat["a"].astype(np.float32), t.float().numpy())
  np.testing.assert_array_equal(flat["b"], np.arange(4))
  # A sharded HF directory: two files and the index.
  d = tmp_path / "hf"
  d.mkdir()
  save_file({"a": t}, str(d / "model-00001-of-00002.safetensors"))
  save_file({"b": torch.arange(4)}, str(d / "model-00002-of-00002.safetensors"))
  (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
  assert readers.is_safetensors(str(d)) and not readers.is_safetensors(str(tmp_path / "x.npz"))
  sharded = readers.load_safetensors(str(d))
  assert sorted(sharded) == ["a", "b"] and sharded["a"].dtype == ml_dtypes.bfloat16


def test_posemb_resample_is_logged_and_errors_say_what_differs(tmp_path, caplog):
  from fi_jax.models import _posemb as posemb
  _, params = _init(num_classes=5, pool_type="gap")
  path = str(tmp_path / "p.npz")
  readers.save_npz(path, params)
  _, init48 = _init(res=48, num_classes=5, pool_type="gap")
  with caplog.at_level("WARNING", logger="fi_jax.models._posemb"):
    vit.load(init48, path)
  assert [r.getMessage() for r in caplog.records if "posemb" in r.getMessage()] == [
      "Resampled the posemb grid from 4x4 to 6x6 (the model's input size / patch size differ "
      "from the checkpoint's)."]
  with pytest.raises(ckpt.CheckpointError, match=r"width \(channels\) differs \(checkpoint "
                     r"\(1, 16, 32\), model \(1, 16, 48\)\).*width 32.*width 48.*width="):
    posemb.resample_posemb(np.zeros((1, 16, 32)), (1, 16, 48))
  with pytest.raises(ckpt.CheckpointError, match=r"grid \(tokens\) differs \(checkpoint "
                     r"\(1, 16, 32\), model \(1, 24, 32\)\) and the model's 24 tokens are not a "
                     r"square h x w grid.*res="):
    posemb.resample_posemb(np.zeros((1, 16, 32)), (1, 24, 32))


def test_adopted_posemb_grid_is_logged(caplog):
  """CLIP / DINOv2 keep the checkpoint's posemb grid (resized per call): logged at INFO."""
  from fi_jax.models.convert import torch_layers
  init = {"pos_embedding": jax.ShapeDtypeStruct((1, 1 + 16, 8), jnp.float32)}
  with caplog.at_level("INFO", logger="fi_jax.models.convert.torch_layers"):
    out = torch_layers._adopt_posemb(
        init, "pos_embedding", np.zeros((1, 1 + 36, 8)), "f.pth", "")
  assert out["pos_embedding"].shape == (1, 37, 8)
  assert [r.getMessage() for r in caplog.records] == [
      "f.pth: the posemb keeps the checkpoint's 6x6 grid (the model was initialised with 4x4); "
      "it is resized to each input's patch grid per call."]
