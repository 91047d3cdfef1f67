"""RankFeat vs independent references of the official code / OpenOOD v1.5's rankfeat
postprocessor (read for facts: KingJamesSong/RankFeat @ 1c0de9cf84184972c7dc50b9442fe8f6066b789b,
OpenOOD @ 3c35632ee91b54b09d1f085d04f94744cece7d0b): small random torchvision ResNet, timm
BiT ResNetV2 and timm ViT models whose late block outputs are modified by torch forward hooks
(rank-1 component removed with a float64 torch SVD), the same weights loaded into fi_jax through
the real loaders; the ViT T2T form against a numpy tail; a constructed case where RankFeat
separates what MSP ranks the wrong way round; errors; the pipeline round trip.
"""
import functools

import flax.linen
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.special

from configs import common, demo
from fi_jax import detectors, pipeline
from fi_jax.common import distributed
from fi_jax.detectors import rankfeat
from fi_jax.extract import forward as extract
from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import resnet, resnetv2, vit
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model
from tests.helpers.compilation import compilations
from tests.helpers.torch_reference import perturb_norms, randomize_params, save_state_dict

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
tv_resnet = pytest.importorskip("torchvision.models.resnet")

RTOL = 1e-6
C = 10


def f64(x):
  return np.asarray(x, np.float64)


def init_shapes(model, size):
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, size, size, 3))))["params"]


def images(n, size, seed=0):
  return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)


def torch_remove_rank1(f):
  """The official code's removal on a [B, M, N] float64 tensor (torch.linalg.svd)."""
  u, s, v = torch.linalg.svd(f, full_matrices=False)
  return f - s[:, 0:1].unsqueeze(2) * u[:, :, 0:1].bmm(v[:, 0:1, :])


def nchw_hook(mod, inp, out):
  """Forward hook: the block's [B, C, H, W] output with each [C, HW] matrix's rank-1 part
  removed (returned, so it replaces the output)."""
  b, c, h, w = out.shape
  return torch_remove_rank1(out.reshape(b, c, h * w)).reshape(b, c, h, w)


def token_hook(mod, inp, out):
  return torch_remove_rank1(out)


def torch_logits(ref, x, block=None, hook=nchw_hook):
  """float64 logits of `ref` on NHWC `x`, with `block`'s output modified by `hook`."""
  handle = block.register_forward_hook(hook) if block is not None else None
  try:
    with torch.no_grad():
      return ref(torch.tensor(f64(x)).permute(0, 3, 1, 2)).numpy()
  finally:
    if handle is not None:
      handle.remove()


def energy(z, t=1.0):
  return t * scipy.special.logsumexp(f64(z) / t, axis=1)


def rel_err(got, want):
  return float(np.max(np.abs(f64(got) - want) / np.abs(want)))


def fi_scores(model, params, x, **hp):
  det = detectors.build("rankfeat", **hp)
  logits_fn = lambda v: model.apply({"params": params}, v)[0]
  return np.asarray(det.score_inputs({}, logits_fn, x))


# ----------------------------------------------------------------------------- ResNet / BiT

@pytest.fixture(scope="module")
def tv_case(tmp_path_factory):
  """torchvision ResNet (basic blocks, 2 blocks in stages 3 and 4: the *last* block is the
  target), float64 reference; fi_jax loads the same weights."""
  torch.manual_seed(0)
  ref = perturb_norms(tv_resnet.ResNet(tv_resnet.BasicBlock, [1, 1, 2, 2], num_classes=C,
                                 width_per_group=64))
  path = save_state_dict(ref, tmp_path_factory.mktemp("tv") / "resnet.safetensors")
  model = resnet.Model(C, variant="resnet18", depths=(1, 1, 2, 2))
  return ref.double(), model, resnet.load(init_shapes(model, 64), path)


@pytest.fixture(scope="module")
def bit_case(tmp_path_factory):
  from timm.layers import StdConv2d
  from timm.models.resnetv2 import ResNetV2
  torch.manual_seed(0)
  ref = perturb_norms(ResNetV2(layers=[1, 1, 2, 2], channels=(64, 64, 128, 128), width_factor=2,
                         stem_chs=16, num_classes=C, stem_type="fixed",
                         conv_layer=functools.partial(StdConv2d, eps=1e-8)))
  path = save_state_dict(ref, tmp_path_factory.mktemp("bit") / "model.safetensors")
  model = resnetv2.Model(C, variant="resnetv2_50x1_bit", depths=(1, 1, 2, 2),
                         channels=(64, 64, 128, 128), width_factor=2, stem_width=16)
  return ref.double(), model, resnetv2.load(init_shapes(model, 64), path)


def _stage_blocks(kind, ref):
  if kind == "tv":
    return ref.layer3, ref.layer4
  return ref.stages[2], ref.stages[3]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tv", "bit"])
@pytest.mark.parametrize("blocks", ["3+4", "4", "3"])
def test_resnet_matches_torch_hooks(kind, blocks, tv_case, bit_case):
  ref, model, params = tv_case if kind == "tv" else bit_case
  x = images(3, 64)
  stage3, stage4 = _stage_blocks(kind, ref)
  z4, z3 = torch_logits(ref, x, stage4), torch_logits(ref, x, stage3)
  want = {"3+4": energy((z4 + z3) / 2), "4": energy(z4), "3": energy(z3)}[blocks]
  got = fi_scores(model, params, x, blocks=blocks)
  assert got.dtype == np.float64 and got.shape == (3,)
  assert rel_err(got, want) < RTOL, rel_err(got, want)
  # the removal matters: the plain energy differs by far more than the tolerance
  assert rel_err(energy(torch_logits(ref, x)), want) > 100 * RTOL


@pytest.mark.slow
def test_temperature(tv_case):
  ref, model, params = tv_case
  x = images(2, 64, seed=1)
  stage3, stage4 = _stage_blocks("tv", ref)
  want = energy((torch_logits(ref, x, stage4) + torch_logits(ref, x, stage3)) / 2, t=2.5)
  assert rel_err(fi_scores(model, params, x, temperature=2.5), want) < RTOL


@pytest.mark.slow
def test_power_iteration_approaches_svd(bit_case):
  """accelerate=True (the official power iteration) converges to the SVD's component."""
  _, model, params = bit_case
  x = images(3, 64, seed=2)
  exact = fi_scores(model, params, x)
  approx = fi_scores(model, params, x, accelerate=True, iterations=200)
  np.testing.assert_allclose(approx, exact, rtol=1e-5)
  f = jnp.asarray(np.random.RandomState(0).randn(4, 9, 6), jnp.float32)
  a = rankfeat.rank1_component(f, accelerate=True, iterations=300)
  want = torch_remove_rank1(torch.tensor(f64(f))).numpy() - f64(f)
  np.testing.assert_allclose(f64(a), -want, atol=1e-5)


# ----------------------------------------------------------------------------- ViT

TINY_VIT = dict(patch_size=(8, 8), width=32, depth=3, mlp_dim=64, num_heads=4, pool_type="tok",
                act="gelu_exact")


@pytest.fixture(scope="module")
def vit_case(tmp_path_factory):
  timm_vit = pytest.importorskip("timm.models.vision_transformer")
  ref = randomize_params(timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=3,
                                              num_heads=4, mlp_ratio=2.0, num_classes=C,
                                              global_pool="token"))
  path = save_state_dict(ref, tmp_path_factory.mktemp("vit") / "model.safetensors")
  model = vit.Model(C, **TINY_VIT)
  return ref.double(), model, vit.load(init_shapes(model, 32), path)


def test_vit_matches_official_form(vit_case):
  """Default vit_block=-2 (official ViT-B/16 form): all tokens after the second-to-last block,
  rank-1 part removed, then the last block, the final norm, the class token, the head."""
  ref, model, params = vit_case
  x = images(3, 32)
  want = energy(torch_logits(ref, x, ref.blocks[-2], token_hook))
  got = fi_scores(model, params, x)
  assert rel_err(got, want) < RTOL, rel_err(got, want)
  assert rel_err(energy(torch_logits(ref, x)), want) > 100 * RTOL


@pytest.mark.slow
def test_vit_t2t_form_against_numpy_tail(vit_case):
  """vit_block=-1 (official T2T-ViT form) against a numpy tail on fi_jax's own last-block
  tokens: float64 SVD removal, LayerNorm (eps 1e-6), class token, head."""
  _, model, params = vit_case
  x = images(3, 32, seed=1)
  _, out = model.apply({"params": params}, x)
  tok = f64(out["encoder"]["pre_ln"])
  u, s, vh = np.linalg.svd(tok, full_matrices=False)
  tok = tok - s[:, :1, None] * u[:, :, :1] * vh[:, :1, :]
  mu, var = tok.mean(-1, keepdims=True), tok.var(-1, keepdims=True)
  ln = params["Transformer"]["encoder_norm"]
  y = (tok - mu) / np.sqrt(var + 1e-6) * f64(ln["scale"]) + f64(ln["bias"])
  z = y[:, 0] @ f64(params["head"]["kernel"]) + f64(params["head"]["bias"])
  got = fi_scores(model, params, x, vit_block=-1)
  assert rel_err(got, energy(z)) < RTOL, rel_err(got, energy(z))


# ----------------------------------------------------------------------------- ranking

@pytest.mark.slow
def test_rankfeat_beats_msp_on_rank1_ood():
  """A ViT whose blocks are identities (zero weights) and whose patch embedding is linear:
  OOD images made of one patch pattern at varying positive scales give an exactly rank-1
  token matrix whose normalised tokens all agree (confident logits: MSP ranks them above the
  random ID images); RankFeat removes that component (OOD logits collapse to the head bias,
  the energy to log C, below every ID energy since the head's classes are centred)."""
  model = vit.Model(C, patch_size=(8, 8), width=32, depth=2, mlp_dim=64, num_heads=4,
                    pool_type="gap")
  params = checkpoints.flatten(jax.device_get(
      model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]))
  rng = np.random.default_rng(0)
  for k, v in params.items():
    if k.startswith("Transformer/encoderblock") or k.endswith("pos_embedding"):
      params[k] = np.zeros_like(v)
  params["embedding/bias"] = np.zeros_like(params["embedding/bias"])
  w = rng.normal(size=params["head/kernel"].shape)
  params["head/kernel"] = (w - w.mean(1, keepdims=True)).astype(np.float32)
  params["head/bias"] = np.zeros_like(params["head/bias"])
  params = checkpoints.recover_tree(params)

  x_id = images(16, 32, seed=3)
  q = rng.normal(size=(16, 1, 1, 8, 8, 3))
  c = rng.uniform(0.5, 2.0, size=(16, 4, 4, 1, 1, 1))
  x_ood = (c * q).transpose(0, 1, 3, 2, 4, 5).reshape(16, 32, 32, 3).astype(np.float32)

  def auroc(s_id, s_ood):
    return float(np.mean(s_id[:, None] > s_ood[None, :]))
  logits = lambda v: np.asarray(model.apply({"params": params}, v)[0])
  msp = lambda v: scipy.special.softmax(f64(logits(v)), 1).max(1)
  rf_id, rf_ood = fi_scores(model, params, x_id), fi_scores(model, params, x_ood)
  assert auroc(msp(x_id), msp(x_ood)) < 0.2
  assert auroc(rf_id, rf_ood) == 1.0
  np.testing.assert_allclose(rf_ood, np.log(C), rtol=1e-5)


# ----------------------------------------------------------------------------- errors

@pytest.mark.slow
def test_unsupported_family_names_the_supported_ones():
  model = vit.Model(C, **{**TINY_VIT, "depth": 2})
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]
  x = images(2, 32)
  dense = lambda v: jnp.reshape(v, (len(v), -1))[:, :C]
  with pytest.raises(ValueError, match=r"no supported block.*resnet.*resnetv2.*vit"):
    detectors.build("rankfeat").score_inputs({}, dense, x)
  jitted = jax.jit(lambda v: model.apply({"params": params}, v)[0])
  jitted(x)   # cached trace: the interceptor never sees the modules
  with pytest.raises(ValueError, match="un-jitted"):
    detectors.build("rankfeat").score_inputs({}, jitted, x)
  with pytest.raises(ValueError, match="vit_block=-3 needs at least 3 encoder blocks"):
    fi_scores(model, params, x, vit_block=-3)
  scanned = vit.Model(C, **{**TINY_VIT, "depth": 2}, scan=True)
  sparams = scanned.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]
  with pytest.raises(ValueError, match="scan=False"):
    fi_scores(scanned, sparams, x)
  with pytest.raises(ValueError, match="score_inputs"):
    detectors.build("rankfeat").score({}, detectors.Outputs(np.zeros((2, 3)), np.zeros((2, C))))
  with pytest.raises(ValueError, match="NHWC"):
    detectors.build("rankfeat").score_inputs({}, dense, np.zeros((2, 8)))


@pytest.mark.parametrize("hp,match", [
    (dict(temperature=0.0), "temperature"), (dict(blocks="2"), "blocks"),
    (dict(vit_block=0), "vit_block"), (dict(vit_block=-1.5), "vit_block"),
    (dict(accelerate=1), "accelerate"), (dict(iterations=0), "iterations")])
def test_hyper_parameter_validation(hp, match):
  with pytest.raises(ValueError, match=match):
    detectors.build("rankfeat", **hp)


def test_presets():
  assert detectors.hparams_of("rankfeat") == {
      "temperature": 1.0, "blocks": "3+4", "vit_block": -2, "accelerate": False,
      "iterations": 20}
  assert detectors.hparams_of("rankfeat", "openood") == detectors.hparams_of("rankfeat")
  assert detectors.hparams_of("rankfeat", "ninco") == detectors.hparams_of("rankfeat")


# ----------------------------------------------------------------------------- pipeline

def _demo_vit():
  """The demo's model (configs/demo.py: depth-2 ViT on 8x8 one-channel digits), random, with a
  non-zero head."""
  model = vit.Model(6, patch_size=(2, 2), width=64, depth=2, mlp_dim=128, num_heads=4,
                    pool_type="gap", head_zeroinit=False)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))["params"]
  predict, _ = run_model.default_predictor(model, params, None)
  return predict, params


@pytest.mark.slow
def test_forward_step_scores_inside_the_one_jitted_step():
  """extract.Forward with RankFeat (and ODIN) as input scorers: one compile of the step for
  two sets, and the scores equal a direct score_inputs call."""
  predict, params = _demo_vit()
  dets = detectors.build_suite(["rankfeat", "odin", "msp"])
  names = pipeline.input_scorer_names(dets, "id_test")
  assert names == ["rankfeat", "odin"] and pipeline.input_scorer_names(dets, "id_fit") == []
  fwd = extract.Forward(predict, distributed.data_mesh(),
                        input_scorers=pipeline.input_scorers(dets, names, predict, (0.5,)))
  rng = np.random.default_rng(0)

  def batches(n_batches, bs=8):
    for i in range(n_batches):
      yield {"image": rng.uniform(-1, 1, (bs, 8, 8, 1)).astype(np.float32),
             "label": np.zeros(bs, np.int32), "group": np.zeros(bs, np.int32),
             "_id": np.arange(i * bs, (i + 1) * bs, dtype=np.int64), "_mask": np.ones(bs, bool)}
  with compilations() as counts:
    sets = [fwd.extract(params, list(batches(n))) for n in (2, 3)]
  assert counts["jit(step)"] == 1, counts
  rng = np.random.default_rng(0)
  x = np.concatenate([b["image"] for b in batches(2)])
  direct = dets["rankfeat"].score_inputs({}, lambda v: predict(params, v)[0], x)
  got = sets[0]["score/rankfeat"]
  assert got.shape == (16,) and np.all(np.isfinite(got))
  np.testing.assert_allclose(got, np.asarray(direct), rtol=RTOL)
  assert rel_err(got, energy(sets[0]["logits"])) > 100 * RTOL   # not the plain energy


@pytest.mark.slow   # ~1 min on CPU; the Forward test above covers the step
def test_demo_run_reports_rankfeat(tmp_path):
  """The demo pipeline (random ViT, no training) with RankFeat: a metric row, the step
  compiled once for every set (the fit set skips the scorers)."""
  c = demo.get_config("quick")
  c.train = ml_collections.ConfigDict()
  c.model.head_zeroinit = False   # a zero head's constant logits: msp and odin degenerate
  c.random_init = True
  c.model_label = "vit-random"
  c.detectors = ("msp", "odin", "rankfeat")
  c.metrics.n_bootstrap = 0
  c.compilation_cache_dir = ""
  with compilations() as counts:
    results = run.run(c, str(tmp_path), log=lambda s: None)
  rows = {r["detector"]: r for r in results["rows"]}
  assert set(rows) == {"msp", "odin", "rankfeat"} and not results.get("errors")
  assert 0.0 <= rows["rankfeat"]["auroc"] <= 1.0
  assert counts["jit(step)"] == 1, counts


def test_configs_list_rankfeat_only_for_supported_families():
  with_odin = common.posthoc_detectors(True, "resnet")
  assert "rankfeat" in with_odin and "odin" in with_odin and "iodin" in with_odin
  assert "rankfeat" in common.posthoc_detectors(True, "two_towers")
  convnext = common.posthoc_detectors(True, "convnext")
  assert "rankfeat" not in convnext and "odin" in convnext
  assert convnext == tuple(n for n in with_odin if n != "rankfeat")
  assert "rankfeat" not in common.posthoc_detectors(False, "resnet")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["dinov2", "clip", "two_towers"])
def test_vit_towers_of_other_families_are_intercepted(family):
  """dinov2 and the image towers of CLIP / SigLIP (two_towers) use vit.Encoder: the image
  tower's block depth-2 is the one modified (an identity modification changes nothing)."""
  from fi_jax.models import clip, dinov2, two_towers
  if family == "dinov2":
    model, res, want = dinov2.Model(width=32, depth=4, num_heads=2, mlp_dim=64, posemb_grid=4,
                                    num_classes=C, head_layers=4), 56, (
                                        "Transformer", "encoderblock_2")
  elif family == "clip":
    model, res, want = clip.Model(out_dim=24, image_size=32,
                                  image=dict(width=64, depth=3, num_heads=2, patch_size=8),
                                  text=dict(width=32, depth=2, num_heads=2)), 32, (
                                      "img", "Transformer", "encoderblock_1")
  else:
    model, res, want = two_towers.Model(
        image=dict(patch_size=(8, 8), width=32, depth=3, mlp_dim=64, num_heads=4,
                   pool_type="map"),
        text=dict(width=32, depth=2, mlp_dim=64, num_heads=4, vocab_size=100),
        out_dim=(None, 32), text_len=16), 32, ("img", "Transformer", "encoderblock_1")
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, res, res, 3)))["params"]
  fn = lambda v: model.apply({"params": params}, v)[0]
  x = images(2, res)
  icpt = rankfeat._Intercept(4, -2, lambda t: t)
  with flax.linen.intercept_methods(icpt):
    z = fn(x)
  assert icpt.family == "vit" and icpt.hits == ["/".join(want)], icpt.hits
  np.testing.assert_array_equal(np.asarray(z), np.asarray(fn(x)))
  got = fi_scores(model, params, x)
  assert np.all(np.isfinite(got)) and got.shape == (2,)
  if family == "dinov2":   # its 4-layer head reads the blocks' "+mlp": the modified one too
    with flax.linen.intercept_methods(rankfeat._Intercept(4, -2, jnp.zeros_like)):
      _, out = model.apply({"params": params}, x)
    assert not np.any(np.asarray(out["encoder"]["block02"]["+mlp"]))
    assert np.any(np.asarray(out["encoder"]["block01"]["+mlp"]))
