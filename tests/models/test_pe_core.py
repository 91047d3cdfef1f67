"""fi_jax PE-Core vs the official forward (tests/helpers/pe_reference.py, a torch reproduction of
facebookresearch/perception_models @ 3e352cc with the official state-dict names) and vs timm's
`vit_pe_core_*` (Eva) / open_clip's text transformer, on tiny random models saved in each real
file format. Two input sizes: the RoPE grid and the resized posemb depend on it.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _releases as releases
from fi_jax.models import clip, pe_core
from fi_jax.models.text import clip_tokenizer

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pe_reference = pytest.importorskip("tests.helpers.pe_reference")

EMBED, RES, PATCH, CTX = 24, 32, 8, 16
TEXT = dict(context_length=CTX, width=32, heads=2, layers=2)
TEXTS = ["a photo of a cat.", "a dog", "Something longer, with punctuation & ÜNICODE! " * 3]


def _vision(cls_token, layerscale=None):
  return dict(patch_size=PATCH, width=64, layers=2, heads=4, mlp_ratio=3.0, image_size=RES,
              use_cls_token=cls_token, attn_pooler_heads=2, ls_init_value=layerscale)


def _fi_model(cls_token, layerscale=None, local=False):
  return pe_core.Model(out_dim=EMBED, image_size=RES, local_tokens=local,
                       image=dict(width=64, depth=2, num_heads=4, mlp_dim=192, patch_size=PATCH,
                                  class_token=cls_token, pool_heads=2, layerscale=layerscale),
                       text=dict(width=32, depth=2, num_heads=2, context_length=CTX))


def _official(cls_token, layerscale=None, seed=0):
  torch.manual_seed(seed)
  m = pe_reference.CLIP(_vision(cls_token, layerscale), output_dim=EMBED, **TEXT)
  with torch.no_grad():   # every tensor off its init (norm scales, zero biases, gammas)
    for p in m.parameters():
      p.add_(0.2 * torch.randn_like(p))
  return m.eval()


_SHAPES = {}


def _init(model, res=RES):
  """Param shapes / dtypes (all `load` needs), traced once per model config and size."""
  key = (repr(model), res)
  if key not in _SHAPES:
    _SHAPES[key] = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3))))["params"]
  return _SHAPES[key]


_JITTED = {}


def _apply(model, params, *args):
  """model.apply, jitted once per model config (same shapes: one compile across tests)."""
  fn = _JITTED.setdefault(repr(model), jax.jit(model.apply))
  with jax.default_matmul_precision("highest"):
    return fn({"params": params}, *args)


def _nchw(img):
  return torch.tensor(img).permute(0, 3, 1, 2)


def _max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module")
def tok():
  return clip_tokenizer.Tokenizer(context_length=CTX)


def _reference(m, img, ids=None):
  with torch.no_grad():
    zi = m.encode_image(_nchw(img)).numpy()
    if ids is None:
      return zi
    zt = m.encode_text(torch.tensor(ids).long()).numpy()
    fi, ft, scale = m(_nchw(img), torch.tensor(ids).long())
    return zi, zt, (scale * fi @ ft.T).numpy()


@pytest.mark.parametrize("cls_token,layerscale,wrapped", [(True, None, False), (False, 0.1, True)],
                         ids=["cls", "no_cls+layerscale+wrapped"])
def test_matches_official_at_two_sizes(cls_token, layerscale, wrapped, tok, tmp_path):
  """Image / text embeddings and zero-shot logits equal the official forward within 1e-4: with
  a class token at the trained 32 px (4x4 grid; both towers; 48 px in the predictor test),
  without (G/14's layout; with layer scale as PE-Spatial) at 48 px (6x6: posemb resized
  bilinearly, RoPE grid 6x6); the official `.pt` file, plain or under
  {'state_dict': {'module.' ...}}."""
  m = _official(cls_token, layerscale)
  sd = m.state_dict()
  if wrapped:
    sd = {"state_dict": {f"module.{k}": v for k, v in sd.items()}}
  path = str(tmp_path / "PE-Core-tiny.pt")
  torch.save(sd, path)
  model = _fi_model(cls_token, layerscale)
  params = pe_core.load(_init(model, 48), path)      # the file's grid whatever the init size
  assert params["img"]["pos_embedding"].shape == (1, int(cls_token) + 16, 64)
  if cls_token:
    ids = tok(TEXTS)
    img = np.random.RandomState(0).randn(2, RES, RES, 3).astype(np.float32)
    zi_ref, zt_ref, logits_ref = _reference(m, img, ids)
    zimg, ztxt, out = _apply(model, params, img, ids)
    assert _max_diff(out["img/logits"], zi_ref) < 1e-4
    assert _max_diff(out["txt/logits"], zt_ref) < 1e-4
    assert _max_diff(clip.logits(zimg, ztxt, params["t"]), logits_ref) < 1e-4
    assert np.std(zi_ref) > 0.1 and np.std(logits_ref) > 0.1   # not a degenerate comparison
    return   # at 48 px: test_zero_shot_predictor_matches_official (one compile fewer)
  img = np.random.RandomState(1).randn(2, 48, 48, 3).astype(np.float32)
  zi_ref = _reference(m, img)
  _, _, out = _apply(model, params, img)
  assert _max_diff(out["img/logits"], zi_ref) < 1e-4
  assert np.std(zi_ref) > 0.1


def test_timm_and_open_clip_layout(tok, tmp_path):
  """open_clip's PE-Core file: timm's vit_pe_core Eva under visual.trunk. and open_clip's
  TextTransformer under text.; both saved by their libraries, compared with their forwards.
  timm's own vision-only file loads into the image tower; a non-zero head bias is refused."""
  timm = pytest.importorskip("timm")
  open_clip = pytest.importorskip("open_clip")
  torch.manual_seed(0)
  trunk = timm.create_model("vit_pe_core_base_patch16_224", pretrained=False, img_size=RES,
                            patch_size=PATCH, embed_dim=64, depth=2, num_heads=4, mlp_ratio=3.0,
                            attn_pool_num_heads=2, ref_feat_shape=(4, 4), num_classes=EMBED).eval()
  text = open_clip.transformer.TextTransformer(output_dim=EMBED, **TEXT).eval()
  with torch.no_grad():
    for p in [*trunk.parameters(), *text.parameters()]:
      p.add_(0.2 * torch.randn_like(p))
    trunk.head.bias.zero_()
  sd = {**{f"visual.trunk.{k}": v for k, v in trunk.state_dict().items()},
        **{f"text.{k}": v for k, v in text.state_dict().items()},
        "logit_scale": torch.tensor(2.5)}
  path = str(tmp_path / "open_clip_model.safetensors")
  safetensors_torch.save_file({k: v.contiguous() for k, v in sd.items()}, path)
  model = _fi_model(True)
  params = pe_core.load(_init(model), path)
  img = np.random.RandomState(0).randn(2, RES, RES, 3).astype(np.float32)
  ids = tok(TEXTS)
  with torch.no_grad():
    zi_ref = trunk(_nchw(img)).numpy()
    zt_ref = text(torch.tensor(ids).long()).numpy()
  _, _, out = _apply(model, params, img, ids)
  assert _max_diff(out["img/logits"], zi_ref) < 1e-4
  assert _max_diff(out["txt/logits"], zt_ref) < 1e-4
  np.testing.assert_allclose(out["t"], np.exp(2.5), rtol=1e-6)
  # timm's own file (vision only): the image tower, given the text tower from elsewhere
  timm_path = str(tmp_path / "model.safetensors")
  safetensors_torch.save_file({k: v.contiguous() for k, v in trunk.state_dict().items()}, timm_path)
  with pytest.raises(checkpoints.CheckpointError, match="image tower only.*dont_load"):
    pe_core.load(_init(model), timm_path)
  img_only = pe_core.load(_init(model), timm_path, dont_load=("txt/.*", "t"))
  assert _max_diff(img_only["img"]["head"]["kernel"], params["img"]["head"]["kernel"]) == 0
  with torch.no_grad():
    trunk.head.bias.fill_(0.5)
  safetensors_torch.save_file({k: v.contiguous() for k, v in trunk.state_dict().items()}, timm_path)
  with pytest.raises(checkpoints.CheckpointError, match="head.bias is not zero"):
    pe_core.load(_init(model), timm_path, dont_load=("txt/.*", "t"))


def test_file_errors_name_key_and_download(tmp_path):
  m = _official(True)
  sd = dict(m.state_dict())
  sd["visual.extra_thing"] = torch.zeros(3)
  path = str(tmp_path / "bad.pt")
  torch.save(sd, path)
  model = _fi_model(True)
  with pytest.raises(checkpoints.CheckpointError, match="visual.extra_thing.*huggingface.co/facebook"):
    pe_core.load(_init(model), path)
  sd = {**m.state_dict(), "text_extra": torch.zeros(3)}
  torch.save(sd, path)
  with pytest.raises(checkpoints.CheckpointError, match="text_extra.*PE-Core.*huggingface.co/facebook"):
    pe_core.load(_init(model), path)
  torch.save({"conv.weight": torch.zeros(2)}, path)
  with pytest.raises(checkpoints.CheckpointError, match="not a PE-Core checkpoint"):
    pe_core.load(_init(model), path)
  torch.save(_official(False).state_dict(), path)      # no class token, model built with one
  with pytest.raises(checkpoints.CheckpointError, match="img/cls|class token"):
    pe_core.load(_init(model), path)


def test_releases_and_variants():
  for name, (kw, res, _, _) in releases.PE_CORE_CHECKPOINTS.items():
    v = pe_core.decode_variant(kw["variant"])
    assert name.split("-")[2].startswith(kw["variant"].replace("/", ""))
    assert name.endswith(str(res))
    assert v["image"]["width"] % v["image"]["num_heads"] == 0
    assert (v["image"]["width"] // v["image"]["num_heads"]) % 4 == 0     # 2-D RoPE pairs
  assert pe_core.decode_variant("G/14")["image"]["class_token"] is False
  assert pe_core.decode_variant("G/14")["text"]["context_length"] == 72
  assert pe_core.decode_variant("B/16")["text"]["context_length"] == 32
  urls = releases.pe_core_urls("PE-Core-L14-336")
  assert urls["official"].startswith("https://huggingface.co/facebook/PE-Core-L14-336")
  with pytest.raises(ValueError, match="Unknown PE-Core variant"):
    pe_core.Model("X/3")


def test_zero_shot_predictor_matches_official(tmp_path):
  """pe_core.predictor at 48 px (CLIP's zero-shot protocol, tokens at the tower's context, 16):
  logits = exp(t) * normalised image embedding . normalised mean class text embeddings, as the
  official forward gives them; predict_out carries GL-MCM's local features (each ln_post'ed
  patch token through the official attention pooling alone, then proj) and local score."""
  pytest.importorskip("fi_jax.detectors")
  from fi_jax.models import _predictor
  m = _official(True)
  path = str(tmp_path / "PE-Core-tiny.pt")
  torch.save(m.state_dict(), path)
  model = _fi_model(True)
  params = pe_core.load(_init(model), path)
  names, templates = ["cat", "dog", "tench"], ["a photo of a {}.", "{}"]
  config = {"zero_shot": dict(class_names=names, templates=templates, batch_size=4)}
  img = np.random.RandomState(0).randn(2, 48, 48, 3).astype(np.float32)   # posemb resized
  tok = clip_tokenizer.Tokenizer(context_length=CTX)
  with jax.default_matmul_precision("highest"):
    predict, head = pe_core.predictor(model, params, config)
    # the layers-capable variant (one compile; the plain `predict` is the same minus `out`)
    logits, feats, out = jax.jit(_predictor.out_variant(predict))(params, img)
  with torch.no_grad():
    zi = torch.nn.functional.normalize(m.encode_image(_nchw(img)), dim=-1)
    cls = []
    for name in names:
      zt = m.encode_text(torch.tensor(tok([t.format(name) for t in templates])).long())
      zt = torch.nn.functional.normalize(zt, dim=-1).mean(0)
      cls.append(zt / zt.norm())
    want = (m.logit_scale.exp() * zi @ torch.stack(cls).T).numpy()
  assert _max_diff(logits, want) < 1e-4
  assert head.w.shape == (EMBED, len(names)) and np.all(np.asarray(head.b) == 0)
  assert _max_diff(feats, zi.numpy()) < 1e-5
  with torch.no_grad():   # GL-MCM's local features: each patch token pooled alone, projected
    tokens = m.visual.tokens(_nchw(img))[:, 1:]
    single = m.visual.attn_pool(tokens.reshape(-1, 1, tokens.shape[-1]))
    local_ref = (single.reshape(*tokens.shape) @ m.visual.proj).numpy()
  assert out["img/local"].shape == (2, 36, EMBED)
  assert _max_diff(out["img/local"], local_ref) < 1e-4
  local = out["img/local_mcm"]
  assert local.shape == (2,) and np.all(np.isfinite(local)) and np.all(local <= 0)
  assert np.all(local >= -np.log(len(names)))    # log max softmax over 3 classes


def _release_cases():
  """Every release with FI_JAX_PE_CORE_SHAPES=all, else none (tracing the large towers is too
  slow for the suite; docs/models.md's PE-Core section)."""
  if os.environ.get("FI_JAX_PE_CORE_SHAPES") == "all":
    return sorted(releases.PE_CORE_CHECKPOINTS)
  return [pytest.param(None, marks=pytest.mark.skip(
      reason="opt-in (minutes): FI_JAX_PE_CORE_SHAPES=all checks every release's shapes"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", _release_cases())
def test_release_variants_have_timm_and_open_clip_shapes(name):
  """A release's Model (variant table) against its open_clip layout built on the meta device
  (timm's vit_pe_core_* trunk, open_clip's TextTransformer from its PE-Core-* config): every
  converted tensor has the model's shape, nothing is missing or extra (no weights, no download)."""
  import json

  timm = pytest.importorskip("timm")
  open_clip = pytest.importorskip("open_clip")
  from fi_jax.models._checkpoints import flatten
  from fi_jax.models.convert import pe_core as convert
  kw, res, open_clip_name, timm_name = releases.PE_CORE_CHECKPOINTS[name]
  model = pe_core.Model(**kw, image_size=res)
  shapes = {k: tuple(v.shape) for k, v in flatten(_init(model, res)).items()}
  dims = pe_core.decode_variant(kw["variant"])
  with open(os.path.join(open_clip.__path__[0], "model_configs", f"{open_clip_name}.json")) as f:
    cfg = json.load(f)
  with torch.device("meta"):
    trunk = timm.create_model(timm_name.split(".")[0], pretrained=False, num_classes=dims["out_dim"])
    text = open_clip.transformer.TextTransformer(output_dim=cfg["embed_dim"], **cfg["text_cfg"])
  sd = {**{f"visual.trunk.{k}": v for k, v in trunk.state_dict().items()},
        **{f"text.{k}": v for k, v in text.state_dict().items()}}
  sd = {k: np.lib.stride_tricks.as_strided(np.zeros((), np.float32), tuple(v.shape),
                                           (0,) * v.ndim) for k, v in sd.items()}
  sd["logit_scale"] = np.zeros((), np.float32)
  heads = {"img": dims["image"]["num_heads"], "txt": dims["text"]["num_heads"], "pool": 8}
  got = {k: tuple(np.shape(v)) for k, v in convert.to_flat(sd, heads, name).items()}
  assert got == shapes
