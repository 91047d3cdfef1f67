"""MAE ViTs: the official fine-tuned classifiers (facebookresearch/mae `models_vit.py`,
global_pool=True: mean over the patch tokens -> fc_norm -> head, no final norm) and timm's
`.mae` encoders, loaded through the zoo from real-format files of randomly initialised timm
models (the official model is timm's VisionTransformer with global_pool='avg'; its release
files are `{"model": state_dict}` .pth), equal to timm on logits and pre-logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import vit, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

TINY = dict(width=32, depth=2, num_heads=2, mlp_dim=64)
TIMM_TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)


def _timm(name, seed, **kw):
  torch.manual_seed(seed)
  m = timm.create_model(name, pretrained=False, **TIMM_TINY, **kw)
  return randomize_params(m, seed, is_scale=lambda n, p: p.ndim == 1 and "norm" in n
                          and n.endswith("weight"))


def _reference(m, x):
  with torch.no_grad():
    feats = m.forward_features(nchw(x))
    return m.forward_head(feats).numpy(), m.forward_head(feats, pre_logits=True).numpy()


def _check(model, params, ref, res, seed=0):
  x = np.random.default_rng(seed).normal(size=(2, res, res, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  want_logits, want_pre = _reference(ref, x)
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_official_finetuned_file_through_the_zoo(tmp_path):
  """mae_finetuned_vit_base.pth layout ({"model": ...}, posemb with the class slot) at 224."""
  ref = _timm("vit_base_patch16_224", 0, global_pool="avg")
  assert "fc_norm.weight" in ref.state_dict() and "norm.weight" not in ref.state_dict()
  path = tmp_path / "mae_finetuned_vit_base.pth"
  torch.save({"model": ref.state_dict(), "epoch": 99}, path)
  model, params, info = zoo.from_pretrained("mae/vit_base_patch16", str(path), **TINY)
  assert info["name"] == "mae/vit_base_patch16.finetuned_in1k" and info["family"] == "vit"
  assert "resize_torchvision(256, 'bicubic')" in info["pp"] and "fc_norm" in params
  assert "encoder_norm" not in params["Transformer"]
  _check(model, params, ref, 224)


def test_huge_layout_patch14_safetensors(tmp_path):
  """The ViT-H/14 arrangement (patch 14) from safetensors at a 4x4 grid."""
  ref = _timm("vit_huge_patch14_224", 1, global_pool="avg", img_size=56, num_classes=10)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model = vit.Model(10, variant="mae_vit_huge_patch14", **TINY)
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 56, 56, 3)))["params"]
  _check(model, vit.load(init, path), ref, 56)


def test_timm_mae_encoder_is_headless(tmp_path):
  """timm's vit_base_patch16_224.mae: the architecture's class-token pooling after the final
  norm (compared with timm in test_vit_variants), no head; its file loads through the zoo."""
  ref = _timm("vit_base_patch16_224", 2, num_classes=0)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  model, params, info = zoo.from_pretrained("timm/vit_base_patch16_224.mae", path, **TINY)
  assert info["num_classes"] == 0 and "head" not in params and model.pool_type == "tok"
  np.testing.assert_array_equal(params["Transformer"]["encoder_norm"]["scale"],
                                ref.norm.weight.detach().numpy())


def test_mae_variants_match_the_official_sizes():
  for name, info in vit.PRETRAINED.items():
    if name.startswith("mae/"):   # MAE's util/datasets.py eval transform, its release files
      assert info["pp"] == ("decode_pil|resize_torchvision(256, 'bicubic')|"
                            "central_crop_torchvision(224)|"
                            "normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))"), name
      size = name.split("_")[1]
      assert info["url"] == f"https://dl.fbaipublicfiles.com/mae/finetune/mae_finetuned_vit_{size}.pth"
  for name, (width, depth, heads, patch) in {
      "mae_vit_base_patch16": (768, 12, 12, 16), "mae_vit_large_patch16": (1024, 24, 16, 16),
      "mae_vit_huge_patch14": (1280, 32, 16, 14)}.items():
    a = vit.ARCHS[name]
    assert (a["width"], a["depth"], a["num_heads"], a["patch_size"]) == (
        width, depth, heads, (patch, patch)) and a["mlp_dim"] == 4 * width
    assert a["pool_type"] == "gap" and a["fc_norm"] and a["class_token"] and a["ln_eps"] == 1e-6


def test_config_names_the_official_release():
  from configs import mae
  c = mae.get_config("name=vit_large_patch16,ckpt=/x/mae_finetuned_vit_large.pth")
  assert (c.model_name, c.model_label) == ("vit", "mae/vit_large_patch16.finetuned_in1k")
  assert c.model.variant == "mae_vit_large_patch16" and tuple(c.init_shape) == (1, 224, 224, 3)
