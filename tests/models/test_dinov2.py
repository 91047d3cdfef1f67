"""fi_jax DINOv2 vs timm's DINOv2 (and the official checkpoint layout / interpolation).

Tiny random timm models (width 32, 4 blocks, 56px = 4x4 patches of 14) are written as timm
safetensors and as official-layout .pth state dicts, loaded through `dinov2.load`, and
compared at the native grid and at other resolutions (posemb interpolation).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _posemb as posemb
from fi_jax.models import _releases as releases
from fi_jax.models import dinov2

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")
F = torch.nn.functional

WIDTH, DEPTH, HEADS, RES, GRID = 32, 4, 2, 56, 4
TOL = 1e-4


def _timm(reg: bool, seed: int = 0, **kw):
  torch.manual_seed(seed)
  name = "vit_small_patch14_reg4_dinov2" if reg else "vit_small_patch14_dinov2"
  args = dict(embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS, img_size=RES, num_classes=0,
              dynamic_img_size=True)
  m = timm.create_model(name, pretrained=False, **{**args, **kw}).eval()
  with torch.no_grad():   # LayerScale / LayerNorm / biases / tokens off their trivial init
    for n, p in m.named_parameters():
      if p.ndim == 1 and n.endswith(("weight", "gamma")):
        p.copy_(1 + 0.3 * torch.randn_like(p))
      elif p.ndim == 1 or "token" in n or "pos_embed" in n:
        p.copy_(0.3 * torch.randn_like(p))
  return m


def _official_sd(m, reg: bool):
  """timm state dict -> DINOv2's own layout (posemb with a cls slot, register_tokens,
  mask_token); the same function as the timm model."""
  sd = {k: v.clone() for k, v in m.state_dict().items()}
  if reg:   # timm folds the cls posemb into cls_token; split it off again
    pos0 = 0.3 * torch.randn(1, 1, WIDTH)
    sd["pos_embed"] = torch.cat([pos0, sd["pos_embed"]], dim=1)
    sd["cls_token"] = sd["cls_token"] - pos0
    sd["register_tokens"] = sd.pop("reg_token")
  sd["mask_token"] = torch.zeros(1, WIDTH)
  return sd


def _fi(reg: bool, timm_interp: bool = False, **kw):
  interp = dict(interpolate_offset=0.0, interpolate_antialias=True) if timm_interp else {}
  args = dict(width=WIDTH, depth=DEPTH, num_heads=HEADS, mlp_dim=4 * WIDTH, posemb_grid=GRID,
              num_registers=4 if reg else 0)
  return dinov2.Model(**{**args, **interp, **kw})


def _init(model, res=RES):
  """Param shapes / dtypes (all `load` needs), without compiling or running the init."""
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3))))[
      "params"]


def _apply(model, params, img):
  with jax.default_matmul_precision("highest"):
    return jax.jit(model.apply)({"params": params}, img)


def _ref(m, img, reg: bool):
  """timm reference: final-normed cls / patch tokens and DINOv2's linear-head inputs."""
  r = 4 if reg else 0
  with torch.no_grad():
    t = torch.tensor(img).permute(0, 3, 1, 2)
    tokens = m.forward_features(t)
    inter = m.forward_intermediates(t, indices=4, norm=True, return_prefix_tokens=True,
                                    output_fmt="NLC", intermediates_only=True)
  cls, patch = tokens[:, 0], tokens[:, 1 + r:]
  lin4 = torch.cat([prefix[:, 0] for _, prefix in inter] + [patch.mean(1)], dim=-1)
  lin1 = torch.cat([cls, patch.mean(1)], dim=-1)
  return {"cls": cls.numpy(), "patch_tokens": patch.numpy(), "lin4": lin4.numpy(),
          "lin1": lin1.numpy()}


def _diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _img(res, seed=0, n=2):
  return np.random.RandomState(seed).randn(n, res, res, 3).astype(np.float32)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "reg4"])
def timm_ckpt(request, tmp_path_factory):
  reg = request.param
  m = _timm(reg)
  d = tmp_path_factory.mktemp("dinov2")
  path = str(d / "model.safetensors")
  safetensors_torch.save_file({k: v.contiguous() for k, v in m.state_dict().items()}, path)
  official = str(d / "dinov2_pretrain.pth")
  torch.save(_official_sd(m, reg), official)
  return m, reg, path, official


@pytest.mark.parametrize("res", [84, 42])
def test_matches_timm(timm_ckpt, res):
  """timm's own weights; its interpolation (exact size, bicubic, antialias) up and down
  (the native 56px grid is covered by test_linear_heads)."""
  m, reg, path, _ = timm_ckpt
  model = _fi(reg, timm_interp=True)
  params = dinov2.load(_init(model), path, {})
  img = _img(res)
  _, out = _apply(model, params, img)
  want = _ref(m, img, reg)
  assert out["cls"].dtype == jnp.float32
  assert _diff(out["cls"], want["cls"]) < TOL
  assert _diff(out["patch_tokens"], want["patch_tokens"]) < TOL
  assert _diff(out["pre_logits"], want["lin4"]) < TOL       # head_layers=4 features
  assert out["register_tokens"].shape == (2, 4 if reg else 0, WIDTH)


def test_official_layout_and_interpolation(timm_ckpt):
  """Official .pth layout with DINOv2's default interpolation: register models resize to
  the exact grid with antialias (= timm); plain models use interpolate_offset=0.1 without
  antialias (F.interpolate with scale_factor), which is *not* what timm does."""
  m, reg, _, official = timm_ckpt
  model = _fi(reg)
  params = dinov2.load(_init(model), official, {})
  res, g = 84, 6
  img = _img(res, seed=3)
  _, out = _apply(model, params, img)
  if reg:
    ref_model = m
  else:
    with torch.no_grad():
      pos = m.pos_embed
      grid = pos[:, 1:].reshape(1, GRID, GRID, -1).permute(0, 3, 1, 2)
      sf = (g + 0.1) / GRID
      grid = F.interpolate(grid, scale_factor=(sf, sf), mode="bicubic", antialias=False)
      new_pos = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, g * g, -1)], dim=1)
    ref_model = _timm(reg, img_size=res, dynamic_img_size=False)
    ref_model.load_state_dict({**m.state_dict(), "pos_embed": new_pos})
  want = _ref(ref_model, img, reg)
  assert _diff(out["cls"], want["cls"]) < TOL
  assert _diff(out["patch_tokens"], want["patch_tokens"]) < TOL
  if not reg:   # document the timm / DINOv2 difference: it is real, not rounding
    assert _diff(out["patch_tokens"], _ref(m, img, reg)["patch_tokens"]) > 1e-3


@pytest.mark.slow
def test_linear_heads(timm_ckpt, tmp_path):
  """linear4 head (5*D features) on the plain model, linear head (2*D) on the reg4 model."""
  m, reg, _, official = timm_ckpt
  layers = 1 if reg else 4
  torch.manual_seed(layers)
  head = torch.nn.Linear((1 + layers) * WIDTH, 7)
  head_file = str(tmp_path / "linear_head.pth")
  torch.save(head.state_dict(), head_file)
  model = _fi(reg, timm_interp=True, num_classes=7, head_layers=layers)
  params = dinov2.load(_init(model), official, {}, head=head_file)   # config: model_load.head
  img = _img(RES, seed=5)
  logits, out = _apply(model, params, img)
  feats = _ref(m, img, reg)["lin4" if layers == 4 else "lin1"]
  with torch.no_grad():
    want = head(torch.tensor(feats)).numpy()
  assert out["pre_logits"].shape == (2, (1 + layers) * WIDTH)
  assert _diff(out["pre_logits"], feats) < TOL
  assert _diff(logits, want) < TOL
  # one file holding the hub classifier (backbone.* + linear_head.*)
  combined = str(tmp_path / "classifier.pth")
  torch.save({**{f"backbone.{k}": v for k, v in torch.load(official).items()},
              **{f"linear_head.{k}": v for k, v in head.state_dict().items()}}, combined)
  params2 = dinov2.load(_init(model), combined, {})
  assert _diff(_apply(model, params2, img)[0], want) < TOL
  # a head for the other feature layout gives one clear error
  other = _fi(reg, num_classes=7, head_layers=1 if layers == 4 else 4)
  with pytest.raises(checkpoints.CheckpointError, match=f"head takes {(1 + layers) * WIDTH}"):
    dinov2.load(_init(other), {"backbone": official, "head": head_file}, {})


def test_giant_swiglu(tmp_path):
  """DINOv2-g's SwiGLU FFN (official w12/w3 names) through vit's 'swiglu' activation."""
  torch.manual_seed(0)
  m = timm.create_model("vit_giant_patch14_dinov2", pretrained=False, embed_dim=WIDTH,
                        depth=2, num_heads=HEADS, img_size=RES, num_classes=0).eval()
  with torch.no_grad():
    for n, p in m.named_parameters():
      if p.ndim == 1:
        p.copy_((1 if n.endswith(("weight", "gamma")) else 0) + 0.3 * torch.randn_like(p))
  sd = {k.replace("mlp.fc1", "mlp.w12").replace("mlp.fc2", "mlp.w3"): v
        for k, v in m.state_dict().items()}
  path = str(tmp_path / "dinov2_vitg14_pretrain.pth")
  torch.save(sd, path)
  hidden2 = sd["blocks.0.mlp.w12.weight"].shape[0]
  model = dinov2.Model(width=WIDTH, depth=2, num_heads=HEADS, mlp_dim=hidden2, act="swiglu",
                       posemb_grid=GRID, head_layers=1)
  params = dinov2.load(_init(model), path, {})
  img = _img(RES, seed=7)
  _, out = _apply(model, params, img)
  with torch.no_grad():
    want = m.forward_features(torch.tensor(img).permute(0, 3, 1, 2))[:, 0].numpy()
  assert _diff(out["cls"], want) < TOL
  g = jax.eval_shape(lambda: dinov2.Model(variant="g/14", head_layers=0, depth=1).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3))))["params"]
  mlp = g["Transformer"]["encoderblock_0"]["MlpBlock_0"]
  assert mlp["Dense_0"]["kernel"].shape == (1536, 8192)     # official w12: (8192, 1536)
  assert mlp["Dense_1"]["kernel"].shape == (4096, 1536)     # official w3: (1536, 4096)
  assert g["pos_embedding"].shape == (1, 1 + 37 * 37, 1536)


def test_posemb_keeps_checkpoint_grid(timm_ckpt):
  """The loaded posemb keeps the file's grid whatever `posemb_grid` says (the official files
  are 37x37 and models run at 16x16): the loaded params do not depend on it."""
  _, reg, path, _ = timm_ckpt
  small, big = _fi(reg, timm_interp=True), _fi(reg, timm_interp=True, posemb_grid=6)
  p_small = dinov2.load(_init(small), path, {})
  p_big = dinov2.load(_init(big), path, {})
  assert _init(big)["pos_embedding"].shape == (1, 37, WIDTH)
  assert p_big["pos_embedding"].shape == (1, 1 + GRID * GRID, WIDTH)
  jax.tree.map(np.testing.assert_array_equal, p_big, p_small)


@pytest.mark.parametrize("n_in,n_out,aa,sf", [
    (4, 6, False, None), (4, 6, True, None), (6, 3, True, None), (6, 3, False, None),
    (37, 16, True, None), (37, 16, False, 16.1 / 37), (5, 9, False, 9.1 / 5), (7, 7, True, None)])
def test_bicubic_matches_torch_interpolate(n_in, n_out, aa, sf):
  grid = np.random.RandomState(n_in * n_out).randn(1, 3, n_in, n_in).astype(np.float32)
  kw = {"scale_factor": (sf, sf)} if sf else {"size": (n_out, n_out)}
  want = F.interpolate(torch.tensor(grid), mode="bicubic", antialias=aa, align_corners=False,
                       **kw).numpy()[0].transpose(1, 2, 0)
  got = posemb.resize_grid(jnp.asarray(grid[0].transpose(1, 2, 0)), (n_out, n_out), aa,
                         (sf, sf) if sf else None)
  assert _diff(got, want) < 1e-5


def test_errors(timm_ckpt, tmp_path):
  m, reg, path, official = timm_ckpt
  model = _fi(reg)
  init = _init(model)
  sd = torch.load(official)
  missing = str(tmp_path / "missing.pth")
  torch.save({k: v for k, v in sd.items() if k != "norm.weight"}, missing)
  with pytest.raises(checkpoints.CheckpointError, match=r"encoder_norm/scale.*dl\.fbaipublicfiles"):
    dinov2.load(init, missing, {})
  extra = str(tmp_path / "extra.pth")
  torch.save({**sd, "blocks.0.attn.q_norm.weight": torch.ones(3)}, extra)
  with pytest.raises(checkpoints.CheckpointError, match="q_norm"):
    dinov2.load(init, extra, {})
  with pytest.raises(checkpoints.CheckpointError, match="registers|register"):
    dinov2.load(_init(_fi(not reg)), official, {})
  with pytest.raises(ValueError, match="'backbone'"):
    dinov2.load(init, {"weights": official}, {})
  with pytest.raises(FileNotFoundError, match="dinov2"):
    dinov2.load(init, str(tmp_path / "nope.pth"), {})
  with_head = _fi(reg, num_classes=3)
  with pytest.raises(checkpoints.CheckpointError, match="head/"):
    dinov2.load(_init(with_head), official, {})
  with pytest.raises(ValueError, match="head_layers"):
    _init(_fi(reg, head_layers=2))
  assert releases.dinov2_checkpoint_url("B/14", True, "linear4_head").endswith(
      "dinov2_vitb14/dinov2_vitb14_reg4_linear4_head.pth")


@pytest.mark.slow
def test_pipeline_build_model(timm_ckpt, tmp_path):
  """fi_jax.run.model.build_model on a DINOv2 config: backbone in model_init, head in model_load."""
  ml_collections = pytest.importorskip("ml_collections")
  from configs import common
  from fi_jax.run import model as run_model
  m, reg, _, official = timm_ckpt
  head = torch.nn.Linear((1 + 4) * WIDTH, 5)
  head_file = str(tmp_path / "linear4_head.pth")
  torch.save(head.state_dict(), head_file)
  c = common.base_config()
  c.model_name = "dinov2"
  c.model = ml_collections.ConfigDict(dict(
      num_classes=5, width=WIDTH, depth=DEPTH, num_heads=HEADS, mlp_dim=4 * WIDTH,
      num_registers=4 if reg else 0, interpolate_offset=0.0, interpolate_antialias=True))
  c.init_shape = (1, 84, 84, 3)
  c.model_init = official
  c.model_load = ml_collections.ConfigDict(dict(head=head_file))
  predict, params, det_head, _ = run_model.build_model(c, log=lambda s: None)
  img = _img(84, seed=11)
  with jax.default_matmul_precision("highest"):
    logits, feats = jax.jit(predict)(params, img)
  with torch.no_grad():
    want = head(torch.tensor(_ref(m, img, reg)["lin4"])).numpy()
  assert _diff(logits, want) < TOL
  assert _diff(np.asarray(feats) @ np.asarray(det_head.w) + np.asarray(det_head.b), want) < TOL
