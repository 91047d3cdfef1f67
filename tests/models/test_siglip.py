"""SigLIP / SigLIP 2 two towers: equivalence with transformers (safetensors) and big_vision npz layouts."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import _releases as releases
from fi_jax.models import two_towers
from fi_jax.models.convert import readers

W, DEPTH, MLP, HEADS, VOCAB, L, P, RES = 32, 2, 64, 4, 100, 16, 8, 32
IMG = dict(patch_size=(P, P), width=W, depth=DEPTH, mlp_dim=MLP, num_heads=HEADS, pool_type="map")
TXT = dict(width=W, depth=DEPTH, mlp_dim=MLP, num_heads=HEADS, vocab_size=VOCAB)


def _model(scan=False, text_len=L, **kw):
  return two_towers.Model(image={**IMG, "scan": scan}, text={**TXT, "scan": scan}, out_dim=(None, W),
                          bias_init=-10.0, text_len=text_len, **kw)


def _init(model, res=RES):
  """Shapes / dtypes of the init tree (what the loaders need; no random init is computed)."""
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


def _random_params(model, seed=1):
  flat = ckpt.flatten(_init(model))
  rng = np.random.default_rng(seed)
  return ckpt.recover_tree({k: (rng.normal(size=np.shape(v)) * 0.2).astype(np.float32)
                            for k, v in flat.items()})


def _inputs(n=2, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.uniform(-1, 1, (n, RES, RES, 3)).astype(np.float32),
          rng.integers(0, VOCAB, (n, L)).astype(np.int32))


_JITTED = {}


def _apply(model, params, images, texts):
  """Jitted apply, compiled once per model config (tests reuse configs a lot)."""
  fn = _JITTED.setdefault(repr(model), jax.jit(model.apply))
  with jax.default_matmul_precision("highest"):
    return fn({"params": params}, images, texts)


def test_outputs_and_single_inputs():
  model = _model()
  params = _random_params(model)
  assert set(params) == {"img", "txt", "t", "b"} and "head" not in params["img"]
  assert params["txt"]["pos_embedding"].shape == (1, L, W)
  images, texts = _inputs()
  zimg, ztxt, out = _apply(model, params, images, texts)
  np.testing.assert_allclose(np.linalg.norm(zimg, axis=-1), 1, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(ztxt, axis=-1), 1, atol=1e-5)
  np.testing.assert_allclose(out["pre_logits"], zimg)
  assert out["img/pre_logits"].shape == (2, W) and float(out["t"][0]) == pytest.approx(np.exp(params["t"][0]))
  zi, zt, _ = _apply(model, params, images, None)
  assert zt is None and np.allclose(zi, zimg, atol=1e-5)
  zi, zt, _ = _apply(model, params, None, texts)
  assert zi is None and np.allclose(zt, ztxt, atol=1e-5)


# ----------------------------------------------------------------------------- big_vision npz

def _write(path, tree, *, prefix, scanned, bf16):
  tree = jax.tree.map(np.asarray, tree)
  if scanned:
    tree["img"]["Transformer"] = ckpt.stack_blocks(tree["img"]["Transformer"])
    tree["txt"]["Encoder_0"] = ckpt.stack_blocks(tree["txt"]["Encoder_0"])
  flat = {prefix + k: (v.astype(ml_dtypes.bfloat16) if bf16 else v) for k, v in ckpt.flatten(tree).items()}
  np.savez(path, **flat)
  with np.load(path) as z:
    key = prefix + ("img/Transformer/encoderblock/LayerNorm_0/scale" if scanned else
                    "img/Transformer/encoderblock_0/LayerNorm_0/scale")
    assert key in z.files and (z[key].dtype.str == "|V2") == bf16


@pytest.mark.parametrize("layout", [dict(prefix="", scanned=False, bf16=False),      # SigLIP 1
                                    dict(prefix="params/", scanned=True, bf16=True)])  # SigLIP 2
@pytest.mark.parametrize("scan", [False, True])
def test_npz_layouts(tmp_path, layout, scan):
  ref_model = _model()
  ref = _random_params(ref_model)
  if layout["bf16"]:  # the reference is what bf16 storage keeps
    ref = jax.tree.map(lambda a: np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32), ref)
  path = str(tmp_path / "siglip.npz")
  _write(path, ref, **layout)
  model = _model(scan=scan)
  params = two_towers.load(_init(model), path)
  images, texts = _inputs()
  want = _apply(ref_model, ref, images, texts)
  got = _apply(model, params, images, texts)
  for g, w in zip(got[:2], want[:2]):
    np.testing.assert_allclose(g, w, atol=1e-5)
  np.testing.assert_array_equal(params["b"], ref["b"])


def test_dict_init_files_and_posemb_resample(tmp_path):
  ref = _random_params(_model())
  path = str(tmp_path / "two.npz")
  readers.save_npz(path, ref)
  model = _model()
  # Device arrays as init leaves (what a real `model.init` gives the pipeline).
  init48 = jax.tree.map(jnp.asarray, ckpt.recover_tree({
      k: np.zeros(v.shape, v.dtype) for k, v in ckpt.flatten(_init(model, res=48)).items()}))
  params = two_towers.load(init48, {"img": path + ":img", "txt": path + ":txt", "t": path + ":t",
                                    "b": path})
  assert params["img"]["pos_embedding"].shape == (1, 36, W)
  np.testing.assert_array_equal(params["txt"]["Embed_0"]["embedding"], ref["txt"]["Embed_0"]["embedding"])
  np.testing.assert_array_equal(params["t"], ref["t"])
  # The text tower alone: a two-tower file without ':txt' picks the text tower.
  from fi_jax.models.text import transformer as text_transformer
  txt = text_transformer.load(init48["txt"], path)
  np.testing.assert_array_equal(txt["Encoder_0"]["encoderblock_1"]["MlpBlock_0"]["Dense_0"]["kernel"],
                                ref["txt"]["Encoder_0"]["encoderblock_1"]["MlpBlock_0"]["Dense_0"]["kernel"])


def test_mismatch_errors_are_clear(tmp_path):
  ref = _random_params(_model(text_len=64))
  path = str(tmp_path / "webli_en_so400m_224_57633886.npz")
  readers.save_npz(path, ref)
  with pytest.raises(ValueError, match=r"txt/pos_embedding.*\(1, 64, 32\).*\(1, 16, 32\).*"
                                       r"gs://big_vision/siglip/webli_en_so400m_224_57633886.npz"):
    two_towers.load(_init(_model()), path)
  with pytest.raises(FileNotFoundError, match="gs://big_vision/siglip2/siglip2_b16_224.npz"):
    two_towers.load(_init(_model()), "siglip2_b16_224")


def test_release_configs_build_real_trees():
  for name, emb, seq, vocab in (("siglip2_b16_224", 768, 64, 256_000),
                                ("siglip_so400m14_224", 1152, 16, 32_000),
                                ("siglip2_g-opt16_256", 1536, 64, 256_000)):
    cfg = releases.siglip_release_config(name)
    model = two_towers.Model(**cfg["model"])
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros(cfg["init_shape"]))["params"]
    assert shapes["txt"]["Embed_0"]["embedding"].shape[0] == vocab
    assert shapes["txt"]["pos_embedding"].shape[1] == seq
    assert shapes["txt"]["head"]["kernel"].shape[1] == emb and "head" not in shapes["img"]
    assert "MAPHead_0" in shapes["img"] and shapes["b"].shape == (1,)
    assert cfg["pp"].startswith("decode|resize(") and cfg["url"].startswith("gs://big_vision/siglip")
    assert cfg["tokenizer_url"].endswith(".model") and cfg["model_init"] == name


# ----------------------------------------------------------------------------- transformers

def _hf_configs(version):
  vision = dict(hidden_size=W, intermediate_size=MLP, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
                patch_size=P)
  # SigLIP 2: a 6x6 posemb grid, resized NaFlex-style to the 4x4 patches of a 32 px image.
  vision.update(image_size=RES) if version == 1 else vision.update(num_patches=36)
  text = dict(hidden_size=W, intermediate_size=MLP, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
              vocab_size=VOCAB, max_position_embeddings=L, projection_size=W, bos_token_id=None,
              eos_token_id=1, pad_token_id=1)
  return vision, text


def _patchify(images):
  """NHWC -> SigLIP 2 NaFlex patches (N, h*w, P*P*3), (row, col, channel) order."""
  n, h, w, c = images.shape
  x = images.reshape(n, h // P, P, w // P, P, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, (h // P) * (w // P), P * P * c)


@pytest.mark.parametrize("version", [1, 2])
def test_transformers_equivalence(tmp_path, version):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from safetensors.torch import save_file
  vision, text = _hf_configs(version)
  if version == 1:
    ref = transformers.SiglipModel(transformers.SiglipConfig(vision_config=vision, text_config=text))
  else:
    ref = transformers.Siglip2Model(transformers.Siglip2Config(vision_config=vision, text_config=text))
  g = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in ref.named_parameters():
      norm_scale = ("norm" in name) and name.endswith("weight")
      p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if norm_scale else 0.0))
  ref.eval()
  path = str(tmp_path / "model.safetensors")
  save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)

  model = _model(scan=version == 2)  # the loader also converts to the scanned layout
  params = two_towers.load(_init(model), path)
  images, texts = _inputs()
  zimg, ztxt, out = _apply(model, params, images, texts)

  with torch.no_grad():
    ids = torch.from_numpy(texts).long()
    if version == 1:
      kw = dict(pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2))
    else:  # NaFlex at a fixed square size: all patches valid
      kw = dict(pixel_values=torch.from_numpy(_patchify(images)),
                pixel_attention_mask=torch.ones(2, (RES // P) ** 2, dtype=torch.long),
                spatial_shapes=torch.tensor([[RES // P, RES // P]] * 2))
    img_feat = ref.vision_model(**kw).pooler_output.numpy()
    txt_feat = ref.text_model(input_ids=ids).pooler_output.numpy()
    logits = ref(input_ids=ids, **kw).logits_per_image.numpy()
  np.testing.assert_allclose(np.asarray(out["img/pre_logits"]), img_feat, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(out["txt/logits"]), txt_feat, atol=1e-4, rtol=0)
  ours = np.asarray(zimg @ ztxt.T * out["t"] + out["b"])
  np.testing.assert_allclose(ours, logits, atol=1e-4, rtol=0)
  if version == 1:  # the image tower alone, through the ViT loader
    from fi_jax.models import vit
    img_model = vit.Model(**IMG)
    img_params = vit.load(jax.eval_shape(img_model.init, jax.random.PRNGKey(0), images[:1])["params"], path)
    with jax.default_matmul_precision("highest"):
      feats = jax.jit(img_model.apply)({"params": img_params}, images)[0]
    np.testing.assert_allclose(np.asarray(feats), img_feat, atol=1e-4, rtol=0)


def test_naflex_npz_as_fixed_resolution(tmp_path):
  """A NaFlex file (Dense patch embedding, (g, g, D) posemb grid) runs as a square-input ViT."""
  model = _model()
  ref = _random_params(model)
  naflex = jax.tree.map(np.asarray, ref)
  naflex["img"]["embedding"]["kernel"] = naflex["img"]["embedding"]["kernel"].reshape(P * P * 3, W)
  naflex["img"]["pos_embedding"] = naflex["img"]["pos_embedding"].reshape(4, 4, W)
  path = str(tmp_path / "siglip2_b16_naflex.npz")
  readers.save_npz(path, {"params": naflex})
  params = two_towers.load(_init(model), path)
  images, texts = _inputs()
  for g, w in zip(_apply(model, params, images, texts)[:2], _apply(model, ref, images, texts)[:2]):
    np.testing.assert_allclose(g, w, atol=1e-5)
  # A coarser grid is resized (bilinear + antialias, as NaFlex does per image).
  naflex["img"]["pos_embedding"] = np.random.default_rng(0).normal(size=(6, 6, W)).astype(np.float32)
  readers.save_npz(path, {"params": naflex})
  params = two_towers.load(_init(model), path)
  want = jax.image.resize(naflex["img"]["pos_embedding"], (4, 4, W), "bilinear", antialias=True)
  np.testing.assert_allclose(params["img"]["pos_embedding"], np.asarray(want).reshape(1, 16, W), atol=1e-6)
