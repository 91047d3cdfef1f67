"""fi_jax.models.mlp_mixer vs timm's MlpMixer: tiny random timm models of each block kind
(MLP-Mixer, gMixer's SiLU-gated MLPs, ResMLP's affine norms + token Linear + layer scale, gMLP's
spatial gating unit), width 32, depth 1, the real structure otherwise, saved as safetensors /
.pth, loaded through `zoo.from_pretrained` and compared on logits and pre-logits."""
import jax
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import mlp_mixer, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")


def _timm_args(variant):
  """timm's model-function arguments of `variant` (its functions fix embed_dim / num_blocks,
  so the tiny reference is built from the class with them)."""
  from functools import partial

  from timm.layers import GatedMlp, GluMlp
  from timm.models import mlp_mixer as mm
  return {"mixer_b16_224": dict(patch_size=16),
          "gmixer_24_224": dict(patch_size=16, mlp_ratio=(1.0, 4.0), mlp_layer=GluMlp,
                                act_layer=torch.nn.SiLU),
          "resmlp_12_224": dict(patch_size=16, mlp_ratio=4, block_layer=mm.ResBlock,
                                norm_layer=mm.Affine),
          "resmlp_big_24_224": dict(patch_size=8, mlp_ratio=4, norm_layer=mm.Affine,
                                    block_layer=partial(mm.ResBlock, init_values=1e-6)),
          "gmlp_s16_224": dict(patch_size=16, mlp_ratio=6, block_layer=mm.SpatialGatingBlock,
                               mlp_layer=GatedMlp)}[variant]


def _tiny_timm(variant, depth, seed=1):
  torch.manual_seed(0)
  m = timm.models.mlp_mixer.MlpMixer(num_classes=10, embed_dim=32, num_blocks=depth,
                                     **_timm_args(variant))
  return randomize_params(m, seed)


@pytest.mark.parametrize("name,suffix", [
    ("mixer_b16_224.goog_in21k_ft_in1k", "model.safetensors"),
    ("gmixer_24_224.ra3_in1k", "gmixer.pth"),
    ("resmlp_big_24_224.fb_in1k", "model.safetensors"),
    ("gmlp_s16_224.ra3_in1k", "gmlp.pth")])
def test_matches_timm(tmp_path, name, suffix):
  variant = name.split(".")[0]
  ref = _tiny_timm(variant, depth=1)
  path = save_state_dict(ref, tmp_path / suffix)
  arch = mlp_mixer.ARCHS[variant]
  tiny = dict(width=32, depth=1, tokens_hidden=int(arch["tokens_hidden"] / arch["width"] * 32),
              channels_hidden=int(arch["channels_hidden"] / arch["width"] * 32))
  model, params, info = zoo.from_pretrained(f"timm/{name}", path, num_classes=10, **tiny)
  x = np.random.default_rng(0).normal(size=(2, 224, 224, 3)).astype(np.float32)
  logits, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    feats = ref.forward_features(nchw(x))
    want_logits, want_pre = ref.forward_head(feats).numpy(), ref.forward_head(
        feats, pre_logits=True).numpy()
  np.testing.assert_allclose(out["pre_logits"], want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_errors(tmp_path):
  ref = _tiny_timm("resmlp_12_224", depth=1)
  path = save_state_dict(ref, tmp_path / "model.safetensors")
  with pytest.raises(checkpoints.CheckpointError,
                     match=r"'blocks\.0\.(norm1\.weight|mlp_tokens\.fc\d\.\w+)' is missing"):
    zoo.from_pretrained("timm/mixer_b16_224.goog_in21k_ft_in1k", path, num_classes=10,
                        width=32, depth=1, tokens_hidden=16, channels_hidden=128)
  model = mlp_mixer.Model(10, variant="resmlp_12_224", width=32, depth=1)
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, 160, 160, 3)))
  with pytest.raises(checkpoints.CheckpointError, match=r"for 196 tokens \(a 14x14 .* 100 \(10x10\)"):
    mlp_mixer.load(init["params"], path)
  with pytest.raises(ValueError, match="Unknown MLP-Mixer variant"):
    mlp_mixer.Model(variant="mixer_s16_224")


def test_facebook_resmlp_names(tmp_path):
  """Facebook's original ResMLP names (patch_embed, attn, mlp, gamma_*, affines of shape (D,))
  load to the same params as timm's."""
  import safetensors.torch
  ref = _tiny_timm("resmlp_12_224", depth=1)
  timm_path = save_state_dict(ref, tmp_path / "model.safetensors")
  fb = {}
  for k, v in ref.state_dict().items():
    k = (k.replace("stem.", "patch_embed.").replace("linear_tokens.", "attn.")
         .replace("mlp_channels.", "mlp.").replace(".ls", ".gamma_"))
    fb[k] = (v.reshape(-1) if k.endswith((".alpha", ".beta")) else v).contiguous()
  fb_path = str(tmp_path / "resmlp_fb.safetensors")
  safetensors.torch.save_file(fb, fb_path)
  model = mlp_mixer.Model(10, variant="resmlp_12_224", width=32, depth=1, channels_hidden=128)
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, 224, 224, 3)))["params"]
  want, got = mlp_mixer.load(init, timm_path), mlp_mixer.load(init, fb_path)
  jax.tree.map(np.testing.assert_array_equal, got, want)
