"""torchvision ViTs and timm's ViT options (fc_norm / global pool, registers, no_embed_class,
norm_pre, no class token, LayerScale, MAP) against the reference libraries."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from fi_jax.data import preprocess
from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import vit
from fi_jax.models.convert import torch_layers as tl
from tests.helpers.torch_reference import randomize_params

TINY = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=(8, 8))
TV_TINY = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)
TIMM_TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)


def _perturb(module, seed=0):
  """Every parameter random (norm scales, also torchvision's `ln`, around 1)."""
  return randomize_params(module, seed, is_scale=lambda n, p: n.endswith("weight") and p.ndim == 1
                          and ("norm" in n or "ln" in n))


def _images(res, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (2, res, res, 3)).astype(np.float32)


def _init(model, res):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


@functools.lru_cache(maxsize=None)
def _jit(model):
  return jax.jit(model.apply)


def _forward_torch(ref, x, head_name):
  """(logits, input of the final classifier) of the eval-mode reference."""
  feats = {}
  head = ref.get_submodule(head_name)
  hook = head.register_forward_hook(lambda m, i, o: feats.update(x=i[0]))  # returns None
  with torch.no_grad():
    logits = ref(torch.from_numpy(x).permute(0, 3, 1, 2))
  hook.remove()
  return logits.numpy(), feats["x"].numpy()


def _compare(model, params, x, logits, pre_logits):
  got_logits, out = _jit(model)({"params": params}, x)
  np.testing.assert_allclose(np.asarray(out["pre_logits"]), pre_logits, atol=1e-4, rtol=0)
  if logits is not None:
    np.testing.assert_allclose(np.asarray(got_logits), logits, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- torchvision

def _torchvision_ref(**kw):
  from torchvision.models import vision_transformer as tvv
  return _perturb(tvv.VisionTransformer(**{**TV_TINY, "num_classes": 10, **kw}))


@pytest.mark.parametrize("rep", [None, 16])
def test_torchvision_equivalence(tmp_path, rep):
  """torchvision ViT (+ the representation layer) -> .pth -> vit.load: equal outputs."""
  ref = _torchvision_ref(representation_size=rep)
  path = str(tmp_path / "vit.pth")
  torch.save(ref.state_dict(), path)
  model = vit.Model(10, variant="vit_b_16", **TINY, rep_size=rep or False)
  params = vit.load(_init(model, 32), path)
  x = _images(32)
  _compare(model, params, x, *_forward_torch(ref, x, "heads.head"))


def test_torchvision_legacy_mlp_names(tmp_path):
  """Files written before torchvision 0.13 name the MLP linear_1 / linear_2."""
  ref = _torchvision_ref()
  sd = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v
        for k, v in ref.state_dict().items()}
  assert any("linear_1" in k for k in sd)
  path = str(tmp_path / "old.pth")
  torch.save(sd, path)
  model = vit.Model(10, variant="vit_b_16", **TINY)
  params = vit.load(_init(model, 32), path, {"source": "torchvision"})
  x = _images(32)
  _compare(model, params, x, *_forward_torch(ref, x, "heads.head"))


@pytest.mark.parametrize("edit,key", [
    ("drop", "encoder.ln.weight"),
    ("drop", "encoder.layers.encoder_layer_1.self_attention.in_proj_bias"),
    ("shape", "heads.head.weight"),
    ("shape", "class_token"),
    ("extra", "encoder.layers.encoder_layer_0.ln_3.weight"),
    ("extra", "conv_proj.extra"),
])
def test_torchvision_bad_keys(tmp_path, edit, key):
  sd = {k: v.clone() for k, v in _torchvision_ref().state_dict().items()}
  if edit == "drop":
    del sd[key]
  elif edit == "shape":
    sd[key] = torch.zeros(sd[key].shape[0] + 1, *sd[key].shape[1:])
  else:
    sd[key] = torch.zeros(32)
  path = str(tmp_path / "bad.pth")
  torch.save(sd, path)
  model = vit.Model(10, variant="vit_b_16", **TINY)
  with pytest.raises(ckpt.CheckpointError, match=key.replace(".", r"\.")):
    vit.load(_init(model, 32), path)


# ----------------------------------------------------------------------------- timm

# form: (timm architecture, timm overrides, fi_jax overrides). The architecture's own options
# (DeiT-III LayerScale + no_embed_class, CLIP norm_pre + eps 1e-5 + no patch bias, DINOv2
# registers) come from timm's model definitions and from vit.ARCHS.
TIMM_FORMS = {
    "augreg": ("vit_base_patch16_224", {}, {}),
    "deit": ("deit_base_patch16_224", {}, {}),
    "deit3": ("deit3_base_patch16_224", {}, {}),
    "clip_ft": ("vit_base_patch16_clip_224", {}, {}),
    "dinov2_reg4": ("vit_base_patch14_reg4_dinov2", {"num_classes": 0}, {}),
    "avg_fc_norm_cls": ("vit_base_patch16_224", {"global_pool": "avg"},
                        dict(pool_type="gap", class_token=True, fc_norm=True)),
    "avg_no_cls": ("vit_base_patch16_224", {"global_pool": "avg", "class_token": False},
                   dict(pool_type="gap", class_token=False, fc_norm=True)),
    "avg_reg_embed_class": ("vit_base_patch16_224", {"global_pool": "avg", "reg_tokens": 3},
                            dict(pool_type="gap", class_token=True, num_registers=3,
                                 fc_norm=True)),
    "token_fc_norm_reg_no_cls_posemb": (
        "vit_base_patch16_224", {"fc_norm": True, "reg_tokens": 2, "no_embed_class": True},
        dict(fc_norm=True, num_registers=2)),
    "map_with_cls": ("vit_base_patch16_224", {"global_pool": "map"},
                     dict(pool_type="map", class_token=True)),
    # timm architectures whose options come from their own definitions (and vit.ARCHS):
    # MIIL (qkv_bias=False), medium gap (no class token, no qkv bias, LayerScale, norm before
    # the pool: also the path of the SigLIP gap fine-tune), sbb register models
    # (no_embed_class, one or four registers, avg + fc_norm; so150m2 adds no qkv bias),
    # so150m (registers inside the posemb, no LayerScale: test_timm_other_size), the SigLIP
    # MAP fine-tune (MAP head, no class token).
    "miil": ("vit_base_patch16_224_miil", {}, {}),
    "medium_gap": ("vit_medium_patch16_gap_256", {}, {}),
    "sbb_reg1_gap": ("vit_so150m2_patch16_reg1_gap_256", {}, {}),
    "so150m_reg4_gap": ("vit_so150m_patch16_reg4_gap_256", {}, {}),
    "siglip_map": ("vit_so400m_patch14_siglip_378", {}, {}),
}
# new forms that compile a model of their own (each > 3 s): slow
_SLOW_FORMS = ("medium_gap", "sbb_reg1_gap", "siglip_map")


def _forms(names):
  return [pytest.param(f, marks=pytest.mark.slow) if f in _SLOW_FORMS else f for f in names]


def _timm_ref(arch, overrides, res=32):
  import timm
  kw = {**TIMM_TINY, "num_classes": 10, "img_size": res, **overrides}
  return _perturb(timm.create_model(arch, pretrained=False, **kw))


def _save_safetensors(ref, path):
  save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)


@pytest.mark.parametrize("form", _forms(sorted(set(TIMM_FORMS) - {"so150m_reg4_gap"})))
def test_timm_equivalence(tmp_path, form):
  arch, t_kw, f_kw = TIMM_FORMS[form]
  ref = _timm_ref(arch, t_kw)
  path = str(tmp_path / "model.safetensors")
  _save_safetensors(ref, path)
  nc = ref.num_classes or None
  model = vit.Model(nc, variant=arch, **TINY, **f_kw)
  params = vit.load(_init(model, 32), path, {"source": "timm"})
  x = _images(32)
  with torch.no_grad():
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    pre = ref.forward_head(ref.forward_features(xt), pre_logits=True).numpy()
    logits = ref(xt).numpy() if nc else None
  _compare(model, params, x, logits, pre)


@pytest.mark.parametrize("form", ["deit3", "avg_reg_embed_class",
                                  pytest.param("so150m_reg4_gap", marks=pytest.mark.slow)])
def test_timm_other_size(tmp_path, form):
  """The same architecture at 48 px (a 6x6 grid, like timm's *_384 models of the *_224
  ones): built at that size in timm, loaded at that size."""
  arch, t_kw, f_kw = TIMM_FORMS[form]
  ref = _timm_ref(arch, t_kw, res=48)
  path = str(tmp_path / "model.safetensors")
  _save_safetensors(ref, path)
  model = vit.Model(10, variant=arch, **TINY, **f_kw)
  params = vit.load(_init(model, 48), path)
  x = _images(48, seed=1)
  with torch.no_grad():
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    pre = ref.forward_head(ref.forward_features(xt), pre_logits=True).numpy()
    logits = ref(xt).numpy()
  _compare(model, params, x, logits, pre)


def test_timm_bad_keys(tmp_path):
  arch, t_kw, f_kw = TIMM_FORMS["avg_reg_embed_class"]
  model = vit.Model(10, variant=arch, **TINY, **f_kw)
  init = _init(model, 32)
  sd = {k: v.clone() for k, v in _timm_ref(arch, t_kw).state_dict().items()}
  for edit, key in [("drop", "fc_norm.bias"), ("drop", "reg_token"),
                    ("shape", "head.weight"), ("shape", "blocks.1.mlp.fc1.weight"),
                    ("extra", "dist_token"), ("extra", "norm.bias")]:
    bad = dict(sd)
    if edit == "drop":
      del bad[key]
    elif edit == "shape":
      bad[key] = torch.zeros(bad[key].shape[0] + 2, *bad[key].shape[1:])
    elif key == "dist_token":
      bad[key] = torch.zeros(1, 1, 32)
    else:       # a final token norm in an fc_norm model
      bad["norm.weight"], bad["norm.bias"] = torch.ones(32), torch.zeros(32)
    path = str(tmp_path / f"{edit}.safetensors")
    save_file(bad, path)
    with pytest.raises(ckpt.CheckpointError, match=f"'{key}'"):
      vit.load(init, path)


def test_bfloat16_runs_close_to_float32(tmp_path):
  arch, t_kw, f_kw = TIMM_FORMS["dinov2_reg4"]
  ref = _timm_ref(arch, t_kw)
  path = str(tmp_path / "model.safetensors")
  _save_safetensors(ref, path)
  x = _images(32)
  outs = []
  for dtype in ("float32", "bfloat16"):
    model = vit.Model(None, variant=arch, **TINY, **f_kw, dtype=dtype)
    params = vit.load(_init(model, 32), path)
    _, out = _jit(model)({"params": params}, x)
    assert out["pre_logits"].dtype == jnp.float32
    outs.append(np.asarray(out["pre_logits"]))
  scale = np.abs(outs[0]).max()
  np.testing.assert_allclose(outs[1], outs[0], atol=0.05 * scale, rtol=0)


# ----------------------------------------------------------------------------- full size

def _meta_state_dict(build):
  """The full-size model's state dict as zero-stride numpy arrays (names and shapes only)."""
  with torch.device("meta"):
    module = build()
  return {k: np.broadcast_to(np.float32(0), tuple(v.shape))
          for k, v in module.state_dict().items()}


@pytest.mark.parametrize("name", ["torchvision/vit_b_16.IMAGENET1K_V1",
                                  "timm/vit_base_patch16_clip_224.openai_ft_in12k_in1k",
                                  "timm/deit3_base_patch16_224.fb_in22k_ft_in1k",
                                  "timm/vit_base_patch14_reg4_dinov2.lvd142m"])
def test_full_size_keys_and_shapes(name):
  """The published architecture's parameter names and shapes convert onto exactly the tree
  that vit.Model(variant) initialises at the entry's input size."""
  info = vit.PRETRAINED[name]
  arch = info["variant"]
  if info["source"] == "torchvision":
    import torchvision
    build = lambda: getattr(torchvision.models, arch)(image_size=info["input_size"])
  else:
    import timm
    build = lambda: timm.create_model(arch, pretrained=False, num_classes=info["num_classes"],
                                      img_size=info["input_size"])
  flat = _meta_state_dict(build)
  model = vit.Model(info["num_classes"] or None, variant=arch)
  init = _init(model, info["input_size"])
  where = {}
  convert = vit._from_state_dict
  tree, converter = convert(flat, tl.num_heads(init), name, "", where)
  vit.check_converted(tree, init, converter, where, name)
  got = {k: np.shape(v) for k, v in ckpt.flatten(vit.prepare(tree, init)).items()}
  want = {k: tuple(v.shape) for k, v in ckpt.flatten(init).items()}
  assert got == want


# ----------------------------------------------------------------------------- tables

def test_pretrained_table_matches_the_libraries():
  """PRETRAINED's eval transforms and files are those of torchvision's weights enums and
  timm's pretrained_cfg."""
  import timm
  import torchvision
  for name, info in vit.PRETRAINED.items():
    assert info["variant"] in vit.ARCHS, name
    source, tag = name.split("/", 1)
    arch, weights = tag.split(".", 1)
    assert source == info["source"], name
    if source == "mae":   # official MAE releases (tests/models/test_mae.py)
      assert info["variant"] == f"mae_{arch}", name
      continue
    assert arch == info["variant"], name
    if source == "torchvision":
      w = torchvision.models.get_weight(f"{arch.upper().replace('VIT', 'ViT')}_Weights.{weights}")
      t = w.transforms()
      pp = preprocess.torchvision_pp(t.resize_size[0], t.crop_size[0], t.interpolation.value,
                                     tuple(t.mean), tuple(t.std))
      assert (info["url"], info["input_size"], info["pp"]) == (w.url, w.meta["min_size"][0], pp)
      assert info["num_classes"] == len(w.meta["categories"])
    else:
      cfg = timm.models.get_pretrained_cfg(tag).to_dict()
      size = cfg["input_size"][-1]
      pp = preprocess.timm_pp(size, cfg["crop_pct"], cfg["interpolation"], tuple(cfg["mean"]),
                              tuple(cfg["std"]), crop_mode=cfg["crop_mode"])
      assert (info["input_size"], info["num_classes"], info["pp"]) == (
          size, cfg["num_classes"], pp), name
      hub = f"https://huggingface.co/{cfg['hf_hub_id']}"
      assert info["url"] == f"{hub}/resolve/main/model.safetensors"
