"""fi_jax CLIP vs open_clip: tiny random models written as real checkpoints, loaded by fi_jax.

Widths are tiny (2 blocks, width 64/32) but the structure is the real one (conv stem without
bias, ln_pre, causal text mask, EOT pooling, projections, logit scale, real 49408 vocab).
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import clip
from fi_jax.models import zero_shot_head as zero_shot
from fi_jax.models.text import clip_tokenizer

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
safetensors_torch = pytest.importorskip("safetensors.torch")

EMBED, RES, PATCH = 24, 32, 8
VISION = dict(image_size=RES, layers=2, width=64, head_width=32, patch_size=PATCH)
TEXT = dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2)
TEXTS = ["a photo of a cat.", "a dog", "Something longer, with punctuation & ÜNICODE!", ""]


def _fi_model(act, scan=False, image=None):
  return clip.Model(out_dim=EMBED, act=act, scan=scan, image_size=RES,
                    image=dict(width=64, depth=2, num_heads=2, patch_size=PATCH, **(image or {})),
                    text=dict(width=32, depth=2, num_heads=2))


def _ref_model(quick_gelu, image_size=RES, seed=0):
  torch.manual_seed(seed)
  m = open_clip.model.CLIP(embed_dim=EMBED, vision_cfg={**VISION, "image_size": image_size},
                           text_cfg=TEXT, quick_gelu=quick_gelu).eval()
  with torch.no_grad():   # move LayerNorms / biases off their trivial init: a stronger test
    for name, p in m.named_parameters():
      if p.ndim == 1 and name.endswith("weight"):
        p.copy_(1 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias") or "class_embedding" in name:
        p.copy_(0.2 * torch.randn_like(p))
  return m


def _init(model, res=RES):
  """Param shapes / dtypes (all `load` needs), without compiling or running the init."""
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3))))[
      "params"]


def _random(model, res=RES, seed=0):
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda a: (0.1 * rng.randn(*a.shape)).astype(a.dtype), _init(model, res))


def _apply(model, params, *args):
  with jax.default_matmul_precision("highest"):
    return jax.jit(model.apply)({"params": params}, *args)


def _torch_img(img):
  return torch.tensor(img).permute(0, 3, 1, 2)


def _reference(m, img, ids):
  with torch.no_grad():
    zi = m.encode_image(_torch_img(img))
    zt = m.encode_text(torch.tensor(ids).long())
    fi, ft, scale = m(_torch_img(img), torch.tensor(ids).long())
    return zi.numpy(), zt.numpy(), (scale * fi @ ft.T).numpy()


def _max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module")
def tok():
  return clip_tokenizer.Tokenizer()


@pytest.fixture(scope="module")
def images():
  return np.random.RandomState(0).randn(3, RES, RES, 3).astype(np.float32)


def _written(quick_gelu, tmp_path_factory):
  m = _ref_model(quick_gelu)
  path = str(tmp_path_factory.mktemp("clip") / "open_clip_model.safetensors")
  safetensors_torch.save_file({k: v.contiguous() for k, v in m.state_dict().items()}, path)
  return m, path, "quick_gelu" if quick_gelu else "gelu_exact"


@pytest.fixture(scope="module", params=[True, False], ids=["quick_gelu", "gelu"])
def ref_both(request, tmp_path_factory):
  """Both activations (OpenAI-style QuickGELU and OpenCLIP's exact GELU)."""
  return _written(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
  """One model for the loader / layout tests (QuickGELU, as OpenAI's)."""
  return _written(True, tmp_path_factory)


def test_matches_open_clip(ref_both, images, tok):
  m, path, act = ref_both
  model = _fi_model(act)
  params = clip.load(_init(model), path, {})
  ids = tok(TEXTS)
  zi_ref, zt_ref, logits_ref = _reference(m, images, ids)
  zimg, ztxt, out = _apply(model, params, images, ids)
  logits = clip.logits(zimg, ztxt, params["t"])
  assert zimg.dtype == jnp.float32 and out["txt/logits"].dtype == jnp.float32
  assert _max_diff(out["img/logits"], zi_ref) < 1e-4
  assert _max_diff(out["txt/logits"], zt_ref) < 1e-4
  assert _max_diff(logits, logits_ref) < 1e-4
  np.testing.assert_allclose(out["t"], m.logit_scale.exp().item(), rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(out["pre_logits"], axis=-1), 1, atol=1e-5)


def test_wrong_activation_is_visible(ref, images, tok):
  """QuickGELU vs GELU is a real difference: the other activation must not agree."""
  m, path, act = ref
  other = _fi_model("gelu_exact" if act == "quick_gelu" else "quick_gelu")
  params = clip.load(_init(other), path, {})
  zi_ref, _, _ = _reference(m, images, tok(TEXTS))
  _, _, out = _apply(other, params, images)
  assert _max_diff(out["img/logits"], zi_ref) > 1e-3


def test_torch_file_with_wrappers_into_scanned_model(ref, images, tok, tmp_path):
  m, _, act = ref
  path = str(tmp_path / "ckpt.pt")
  torch.save({"state_dict": {f"module.{k}": v for k, v in m.state_dict().items()},
              "epoch": 3}, path)
  model = _fi_model(act, scan=True)
  params = clip.load(_init(model), path, {})
  assert params["img"]["Transformer"]["encoderblock"]["LayerNorm_0"]["scale"].shape == (2, 64)
  ids = tok(TEXTS)
  zi_ref, zt_ref, logits_ref = _reference(m, images, ids)
  zimg, ztxt, out = _apply(model, params, images, ids)
  assert _max_diff(out["img/logits"], zi_ref) < 1e-4
  assert _max_diff(out["txt/logits"], zt_ref) < 1e-4
  assert _max_diff(clip.logits(zimg, ztxt, params["t"]), logits_ref) < 1e-4


def test_posemb_resized_like_open_clip(ref):
  """A 32px checkpoint used at 48px: open_clip resamples at load time (resize_pos_embed,
  bicubic + antialias); fi_jax keeps the checkpoint grid, whatever the init resolution, and
  resizes per call. Features agree."""
  m, path, act = ref
  res = 48
  big = _ref_model(act == "quick_gelu", image_size=res, seed=1)
  sd = dict(m.state_dict())
  open_clip.model.resize_pos_embed(sd, big)
  big.load_state_dict(sd)
  img = np.random.RandomState(1).randn(2, res, res, 3).astype(np.float32)
  with torch.no_grad():
    want = big.encode_image(_torch_img(img)).numpy()
  model = _fi_model(act)
  params = clip.load(_init(model, res), path, {})          # initialised at 48px
  assert params["img"]["pos_embedding"].shape == (1, 1 + 16, 64)   # the file's 4x4 grid
  _, _, out = _apply(model, params, img)
  assert _diff_ok(out["img/logits"], want)
  bad = {k: v.contiguous() for k, v in m.state_dict().items()}
  bad["visual.positional_embedding"] = bad["visual.positional_embedding"][:-1]
  path_bad = path.replace(".safetensors", "-badpos.safetensors")
  safetensors_torch.save_file(bad, path_bad)
  with pytest.raises(checkpoints.CheckpointError, match="square grid"):
    clip.load(_init(model), path_bad, {})


def _diff_ok(a, b, tol=1e-4):
  return _max_diff(a, b) < tol


def test_single_tower_calls_and_init(tok):
  model = _fi_model("quick_gelu")
  shapes = _init(model)
  assert {"img", "txt", "t"} <= set(shapes)        # image-only init still builds the text tower
  assert shapes["txt"]["pos_embedding"].shape == (1, 77, 32)
  assert shapes["img"]["embedding"]["kernel"].shape == (PATCH, PATCH, 3, 64)
  assert "bias" not in shapes["img"]["embedding"]
  assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(shapes))
  text_only = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), None, tok(["a"])))
  assert jax.tree.map(np.shape, text_only["params"]) == jax.tree.map(np.shape, shapes)
  params = _random(model)
  zimg, ztxt, out = _apply(model, params, np.zeros((2, RES, RES, 3), np.float32))
  assert ztxt is None and zimg.shape == (2, EMBED) and out["pre_logits"].shape == (2, EMBED)
  zimg, ztxt, _ = _apply(model, params, None, tok(["a", "b", "c"]))
  assert zimg is None and ztxt.shape == (3, EMBED)


def test_causal_mask_and_eot_pooling(tok):
  """Tokens after EOT (padding) cannot change the embedding; tokens before it do."""
  model = _fi_model("quick_gelu")
  params = _random(model)
  ids = tok(["a photo of a cat"])
  n = int((ids[0] != 0).sum())
  changed_pad = ids.copy()
  changed_pad[0, n:] = 7
  changed_txt = ids.copy()
  changed_txt[0, 2] = 7
  batch = np.concatenate([ids, changed_pad, changed_txt])
  z = np.asarray(_apply(model, params, None, batch)[1])
  np.testing.assert_allclose(z[0], z[1], atol=1e-6)
  assert np.abs(z[0] - z[2]).max() > 1e-4


def test_variants():
  cfg = clip.decode_variant("L/14")
  assert cfg["image"] == dict(width=1024, depth=24, num_heads=16, mlp_dim=4096, patch_size=14)
  assert cfg["text"] == dict(width=768, depth=12, num_heads=12) and cfg["out_dim"] == 768
  shapes = jax.eval_shape(lambda: clip.Model("B/16").init(
      jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3))))["params"]
  assert shapes["img"]["pos_embedding"].shape == (1, 197, 768)
  assert shapes["img"]["head"]["kernel"].shape == (768, 512)
  assert shapes["txt"]["head"]["kernel"].shape == (512, 512)
  assert shapes["txt"]["Embed_0"]["embedding"].shape == (49408, 512)
  with pytest.raises(ValueError, match="Unknown CLIP variant"):
    clip.Model("X/3")


def test_checkpoint_errors(ref, tmp_path):
  m, _, act = ref
  model = _fi_model(act)
  init = _init(model)
  sd = {k: v.contiguous() for k, v in m.state_dict().items()}
  with pytest.raises(FileNotFoundError, match="huggingface.co"):
    clip.load(init, str(tmp_path / "nope.safetensors"), {})
  missing = {k: v for k, v in sd.items() if k != "ln_final.weight"}
  path = str(tmp_path / "missing.safetensors")
  safetensors_torch.save_file(missing, path)
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"Encoder_0/encoder_norm/scale.*huggingface\.co"):
    clip.load(init, path, {})
  path = str(tmp_path / "ok.safetensors")
  safetensors_torch.save_file(sd, path)
  for heads, msg in ((2, r"shape mismatch.*img/.*file .* vs model"), (3, r"3 heads do not divide")):
    wrong = clip.Model(out_dim=EMBED, act=act, text=dict(width=32, depth=2, num_heads=2),
                       image=dict(width=96, depth=2, num_heads=heads, patch_size=PATCH))
    with pytest.raises(checkpoints.CheckpointError, match=msg):
      clip.load(_init(wrong), path, {})
  extra = {**sd, "visual.attnpool.weight": torch.zeros(3)}
  path = str(tmp_path / "extra.safetensors")
  safetensors_torch.save_file(extra, path)
  with pytest.raises(checkpoints.CheckpointError, match="visual.attnpool.weight"):
    clip.load(init, path, {})
  junk = tmp_path / "junk.pt"
  junk.write_bytes(b"not a torch file")
  with pytest.raises(checkpoints.CheckpointError, match="junk.pt"):
    clip.load(init, str(junk), {})
  scripted = str(tmp_path / "ViT-B-16.pt")      # OpenAI's originals are TorchScript archives
  torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), scripted)
  with pytest.raises(checkpoints.CheckpointError, match="TorchScript"):
    clip.load(init, scripted, {})
  other = tmp_path / "weights.msgpack"
  other.write_bytes(b"x")
  with pytest.raises(checkpoints.CheckpointError, match="expected .safetensors"):
    clip.load(init, str(other), {})


def test_torch_files_load_without_torch(ref, tmp_path, monkeypatch):
  m, path, act = ref
  pt = str(tmp_path / "ckpt.bin")
  torch.save(m.state_dict(), pt)
  monkeypatch.setitem(sys.modules, "torch", None)      # as if torch were not installed
  init = _init(_fi_model(act))
  from_torch_file, from_safetensors = clip.load(init, pt, {}), clip.load(init, path, {})
  jax.tree.map(np.testing.assert_array_equal, from_torch_file, from_safetensors)


@pytest.mark.slow
def test_zero_shot_predictor_matches_open_clip(ref, images, tok):
  pytest.importorskip("fi_jax.detectors")
  m, path, act = ref
  model = _fi_model(act)
  params = clip.load(_init(model), path, {})
  names, templates = ["cat", "dog", "tench"], ["a photo of a {}.", "{}"]
  config = {"zero_shot": dict(class_names=names, templates=templates, batch_size=4)}
  with jax.default_matmul_precision("highest"):
    predict, head = clip.predictor(model, params, config)
    logits, feats = predict(params, images)
  with torch.no_grad():
    zi = torch.nn.functional.normalize(m.encode_image(_torch_img(images)), dim=-1)
    cls = []
    for name in names:
      zt = m.encode_text(torch.tensor(tok([t.format(name) for t in templates])).long())
      zt = torch.nn.functional.normalize(zt, dim=-1).mean(0)
      cls.append(zt / zt.norm())
    want = (m.logit_scale.exp() * zi @ torch.stack(cls).T).numpy()
  assert _max_diff(logits, want) < 1e-4
  assert _max_diff(feats, zi.numpy()) < 1e-5
  assert head is not None


def test_openai_templates():
  pytest.importorskip("fi_jax.models.zero_shot_head")
  temps = zero_shot.openai_templates()
  assert len(temps) == 80 and "a bad photo of a {}." in temps and "{}" not in temps


@pytest.mark.slow
def test_pipeline_build_model(ref, images, tok):
  """fi_jax.run.model.build_model on a CLIP config: checkpoint + zero-shot head -> (logits, features)."""
  ml_collections = pytest.importorskip("ml_collections")
  from configs import common
  from fi_jax.run import model as run_model
  m, path, act = ref
  c = common.base_config()
  c.model_name = "clip"
  c.model = ml_collections.ConfigDict(dict(
      out_dim=EMBED, act=act, image=dict(width=64, depth=2, num_heads=2, patch_size=PATCH),
      text=dict(width=32, depth=2, num_heads=2)))
  c.init_shape = (1, RES, RES, 3)
  c.model_init = path
  c.zero_shot = ml_collections.ConfigDict(dict(class_names=["cat", "dog"],
                                               templates=["a photo of a {}."]))
  predict, params, head, _ = run_model.build_model(c, log=lambda s: None)
  with jax.default_matmul_precision("highest"):
    logits, feats = jax.jit(predict)(params, images)
  zt = np.stack([np.asarray(_apply(_fi_model(act), params, None, tok([f"a photo of a {n}."]))[1][0])
                 for n in ("cat", "dog")])
  want = np.exp(float(params["t"][0])) * np.asarray(feats) @ zt.T
  assert logits.shape == (3, 2) and feats.shape == (3, EMBED)
  assert _max_diff(logits, want) < 1e-4
  assert _max_diff(np.asarray(feats) @ np.asarray(head.w) + np.asarray(head.b), logits) < 1e-4
