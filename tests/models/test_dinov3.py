"""fi_jax DINOv3 ViT vs timm's (`vit_*_dinov3[_qkvb]`, timm's Eva with DINOv3 RoPE): tiny
random timm models (width 32, depth 2, patch 16, 4 registers, layer scale) compared on the
pooled features at two patch grids (the RoPE coordinates depend on the grid). The official
layout (`storage_tokens`, `ls1.gamma`, SwiGLU `w1/w2/w3`, a `qkv.bias` whose key third is
non-zero but masked by `bias_mask`, bfloat16-rounded `rope_embed.periods`, `mask_token`) is
written from a timm model by the inverse of timm's checkpoint_filter_fn and compared with
class-token pooling (upstream DINOv3's output; timm's global_pool='token') using the stored
periods."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import dinov3, zoo
from tests.helpers.torch_reference import nchw, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")


def _timm(variant, seed, **kw):
  torch.manual_seed(seed)
  m = timm.create_model(variant, pretrained=False, embed_dim=32, depth=2, num_heads=2,
                        num_classes=0, **kw)
  return randomize_params(m, seed)


def _fi(ref, variant):
  hidden = ref.blocks[0].mlp.fc2.weight.shape[1]
  return dinov3.Model(variant=variant, width=32, depth=2, num_heads=2, mlp_hidden=hidden)


def _features(model, params, ref, res):
  x = np.random.default_rng(res).normal(size=(2, res, res, 3)).astype(np.float32)
  pre, out = jax.jit(model.apply)({"params": params}, x)
  with torch.no_grad():
    want = ref.forward_head(ref.forward_features(nchw(x)), pre_logits=True).numpy()
  return np.asarray(out["pre_logits"]), want, np.asarray(pre)


def _init(model, res=64):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]


def test_timm_mean_pooling_at_two_grids(tmp_path):
  ref = _timm("vit_small_patch16_dinov3", 0)
  model = _fi(ref, "vit_small_patch16_dinov3")
  params = dinov3.load(_init(model), save_state_dict(ref, tmp_path / "model.safetensors"))
  assert "q_bias" not in params["blocks_0"]["attn"] and "head" not in params
  for res in (64, 48):   # 4x4 and 3x3 patches: no parameter depends on the grid
    got, want, logits = _features(model, params, ref, res)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(logits, got)   # headless


def _official(ref):
  """timm names -> the official DinoVisionTransformer's (as released, `.pth`)."""
  sd, out = ref.state_dict(), {}
  for k, v in sd.items():
    k = k.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma")
    k = k.replace("gamma_2", "ls2.gamma").replace("mlp.fc1_g.", "mlp.w1.")
    k = k.replace("mlp.fc1_x.", "mlp.w2.").replace("mlp.fc2.", "mlp.w3.")
    if k.endswith("attn.q_bias"):
      v_bias = sd[k.replace("q_bias", "v_bias")]
      out[k.replace("q_bias", "qkv.bias")] = torch.cat([v, torch.full_like(v, 7.0), v_bias])
      out[k.replace("q_bias", "qkv.bias_mask")] = torch.cat(
          [torch.ones_like(v), torch.zeros_like(v), torch.ones_like(v)])
    elif not k.endswith("attn.v_bias"):
      out[k] = v
  out["mask_token"] = torch.zeros(1, 32)
  out["rope_embed.periods"] = ref.rope.periods.to(torch.bfloat16).float()
  return out


def test_official_layout_with_class_token_pooling(tmp_path):
  ref = _timm("vit_small_plus_patch16_dinov3_qkvb", 1, global_pool="token")
  sd = _official(ref)
  with torch.no_grad():   # the official files' bfloat16-rounded periods, in the reference too
    ref.rope.periods.copy_(sd["rope_embed.periods"])
  assert not torch.equal(sd["rope_embed.periods"], torch.from_numpy(dinov3.rope_periods(16)))
  path = tmp_path / "dinov3_vits16plus_pretrain_lvd1689m-4057cbaa.pth"
  torch.save(sd, path)
  model = _fi(ref, "dinov3_vits16plus")
  params = dinov3.load(_init(model), str(path))
  got, want, _ = _features(model, params, ref, 48)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  sd["blocks.1.attn.qkv.bias_mask"] = torch.ones(96)
  torch.save(sd, tmp_path / "unmasked.pth")
  with pytest.raises(checkpoints.CheckpointError, match=r"blocks\.1\.attn\.qkv\.bias.*non-zero key"):
    dinov3.load(_init(model), str(tmp_path / "unmasked.pth"))


@pytest.mark.parametrize("variant", ["vit_small_plus_patch16_dinov3_qkvb"])
def test_full_size_layout(variant):
  with torch.device("meta"):
    m = timm.create_model(variant, pretrained=False)
  init = _init(dinov3.Model(variant=variant), 32)
  sd = {k: np.broadcast_to(np.float32(0), tuple(v.shape)) for k, v in m.state_dict().items()}
  params = dinov3.convert.convert(sd, init, file=variant)
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)


def test_zoo_pooling_by_source():
  timm_info, official = zoo.resolve("timm/vit_base_patch16_dinov3"), zoo.resolve(
      "dinov3/dinov3_vitb16")
  assert timm_info["family"] == official["family"] == "dinov3"
  assert dinov3.ARCHS[timm_info["variant"]]["pool"] == "avg"
  assert dinov3.ARCHS[official["variant"]]["pool"] == "token"
  assert timm_info["input_size"] == 256 and official["input_size"] == 224
  assert official["url"].endswith("dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth")



# ---------------------------------------------------------------- the 7B and its linear head
# A tiny DinoVisionTransformer with the 7B's structural options (tests/helpers/
# dinov3_vit_reference.py: SwiGLU aligned to 64, no qkv bias under mask_k_bias, 4 storage
# tokens, layer scale, LayerNorm eps 1e-5, an untied `local_cls_norm`) and the official linear
# classifier on concat(class token, patch-token mean), saved as the released files.
_TINY_7B = dict(width=48, depth=2, num_heads=2, mlp_hidden=dinov3.swiglu_hidden(48, 3, 64))


def _official_7b(tmp_path):
  from tests.helpers import dinov3_vit_reference as ref_mod
  torch.manual_seed(0)
  ref = ref_mod.LinearClassifier(ref_mod.DinoVisionTransformer(embed_dim=48, depth=2,
                                                               num_heads=2, ffn_ratio=3.0))
  ref = randomize_params(ref, 3)
  bb = ref.backbone
  assert bb.blocks[0].mlp.w1.weight.shape[0] == _TINY_7B["mlp_hidden"] == 128  # 96 -> 128
  assert bb.blocks[0].attn.qkv.bias is None
  with torch.no_grad():   # the released files' bfloat16-rounded periods
    bb.rope_embed.periods.copy_(bb.rope_embed.periods.to(torch.bfloat16).float())
  backbone = save_state_dict(bb, tmp_path / "dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth")
  head = save_state_dict(ref.linear_head, tmp_path / dinov3.HEAD_FILE)
  return ref, backbone, head


@pytest.mark.slow
def test_7b_linear_classifier_matches_the_official_code(tmp_path):
  ref, backbone, head = _official_7b(tmp_path)
  assert set(torch.load(head, weights_only=True)) == {"weight", "bias"}
  model, params, info = zoo.from_pretrained("dinov3/dinov3_vit7b16_lc",
                                            {"backbone": backbone, "head": head}, **_TINY_7B)
  assert info["num_classes"] == 1000 and info["url"].endswith(dinov3.HEAD_FILE)
  assert info["backbone_url"].endswith("dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth")
  x = np.random.default_rng(0).normal(size=(2, 32, 48, 3)).astype(np.float32)  # 2x3 patches
  logits, out = model.apply({"params": params}, x)
  with torch.no_grad():
    want_pre = ref.linear_input(nchw(x)).numpy()
    want = ref(nchw(x)).numpy()
  assert out["pre_logits"].shape == (2, 96) and logits.shape == (2, 1000)
  np.testing.assert_allclose(np.asarray(out["pre_logits"]), want_pre, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(logits), want, atol=1e-4, rtol=0)
  # one file holding both, as the official wrapper's state_dict(): the same params
  combined = save_state_dict(ref, tmp_path / "lc.pth")
  zeros = jax.tree.map(np.zeros_like, params)
  jax.tree.map(np.testing.assert_array_equal, dinov3.load(zeros, combined), params)
  # `head=` (the config's model_load.head, as fi_jax.run.model passes it): the same params
  jax.tree.map(np.testing.assert_array_equal, dinov3.load(zeros, backbone, None, head=head),
               params)
  # the backbone name: the class token (the head's first half)
  bb_model, bb_params, _ = zoo.from_pretrained("dinov3/dinov3_vit7b16", backbone, **_TINY_7B)
  feats, _ = bb_model.apply({"params": bb_params}, x)
  np.testing.assert_allclose(np.asarray(feats), want_pre[:, :48], atol=1e-4, rtol=0)


def test_7b_head_file_errors(tmp_path):
  _, backbone, head = _official_7b(tmp_path)
  with pytest.raises(checkpoints.CheckpointError, match="needs its head file"):
    zoo.from_pretrained("dinov3/dinov3_vit7b16_lc", backbone, **_TINY_7B)
  with pytest.raises(checkpoints.CheckpointError, match="model is headless"):
    zoo.from_pretrained("dinov3/dinov3_vit7b16", {"backbone": backbone, "head": head},
                        **_TINY_7B)
  with pytest.raises(FileNotFoundError, match=dinov3.HEAD_FILE):
    zoo.from_pretrained("dinov3/dinov3_vit7b16_lc",
                        {"backbone": backbone, "head": str(tmp_path / "missing.pth")})


def test_7b_full_size_layout():
  """The official 7B / head layout (meta tensors) onto the full-size model's shapes."""
  from tests.helpers import dinov3_vit_reference as ref_mod
  with torch.device("meta"):
    ref = ref_mod.LinearClassifier(ref_mod.DinoVisionTransformer(embed_dim=4096, depth=40,
                                                                 num_heads=32, ffn_ratio=3.0))
  arrays = {k: np.broadcast_to(np.float32(0), tuple(v.shape))
            for k, v in ref.state_dict().items()}
  init = _init(dinov3.Model(1000, variant="dinov3_vit7b16_lc"), 32)
  params = dinov3.convert.convert(arrays, init, file="dinov3_vit7b16_lc")
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, init)
  assert init["head"]["kernel"].shape == (8192, 1000)
  assert init["blocks_39"]["mlp"]["fc1_g"]["kernel"].shape == (4096, 8192)
  assert init["rope_periods"].shape == (32,) and "q_bias" not in init["blocks_0"]["attn"]


def test_config_runs_the_7b_classifier_with_its_head(tmp_path):
  """configs/dinov3.py: the zoo's classifier entry, the head file as `model_load.head` (what
  fi_jax.run.model passes to `dinov3.load`)."""
  from configs import dinov3 as config
  c = config.get_config("ckpt=/x/backbone.pth,head=/x/head.pth,dtype=bfloat16")
  assert (c.model_name, c.model_label) == ("dinov3", "dinov3/dinov3_vit7b16_lc.imagenet1k")
  assert c.model.to_dict() == dict(num_classes=1000, variant="dinov3_vit7b16_lc",
                                   dtype="bfloat16")
  assert c.model_init == "/x/backbone.pth" and c.model_load.head == "/x/head.pth"
  assert tuple(c.init_shape) == (1, 224, 224, 3)
