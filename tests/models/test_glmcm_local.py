"""GL-MCM's local features on a tiny random CLIP written as a real open_clip checkpoint: fi_jax's
value path (fi_jax.models.clip `local_tokens`) equals GL-MCM's official computation (AtsuMiyai/
GL-MCM @ 8708a08442e5650889052fd86900969fade06a1b, clip/model.py: the last block with q/k/v
each through out_proj and v + x, then the MLP residual, ln_post, proj) done here on open_clip's
weights; the runner's predictor carries the local score, and the glmcm detector equals the
official score (utils/detection_util.py) on open_clip's features."""
import jax
import numpy as np
import pytest

from fi_jax import detectors
from fi_jax.models import clip
from tests.models import test_clip as tc

torch = pytest.importorskip("torch")
ml_collections = pytest.importorskip("ml_collections")
F = torch.nn.functional


def _official_local(m, images):
  """[B, P, E] local features and [B, E] global ones, as GL-MCM's VisionTransformer.forward."""
  vis, seen = m.visual, {}
  blocks = vis.transformer.resblocks
  hook = blocks[-1].register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
  with torch.no_grad():
    glob = m.encode_image(tc._torch_img(images))
    hook.remove()
    x, blk = seen["x"], blocks[-1]          # [B, N, C]: open_clip's blocks are batch-first
    c = x.shape[-1]
    y = F.linear(blk.ln_1(x), blk.attn.in_proj_weight, blk.attn.in_proj_bias)
    v = F.linear(y[..., 2 * c:], blk.attn.out_proj.weight, blk.attn.out_proj.bias) + x
    v = v + blk.mlp(blk.ln_2(v))
    local = vis.ln_post(v)[:, 1:] @ vis.proj
  return local.double().numpy(), glob.double().numpy()


@pytest.mark.slow
def test_local_tokens_and_glmcm_equal_the_official_code(tmp_path_factory):
  from configs import common
  from fi_jax.run import model as run_model
  m, path, act = tc._written(True, tmp_path_factory)
  images = np.random.RandomState(2).randn(6, tc.RES, tc.RES, 3).astype(np.float32)
  want_local, want_glob = _official_local(m, images)
  model = tc._fi_model(act)
  params = clip.load(tc._init(model), path, {})
  out = tc._apply(model.clone(local_tokens=True), params, images)[2]
  assert tc._max_diff(out["img/local"], want_local) < 1e-5
  assert "img/local" not in tc._apply(model, params, images)[2]     # only on request
  with pytest.raises(ValueError, match="needs the unrolled encoder"):
    tc._fi_model(act, scan=True).clone(local_tokens=True).init(
        jax.random.PRNGKey(0), np.zeros((1, tc.RES, tc.RES, 3), np.float32))

  c = common.base_config()
  c.model_name = "clip"
  c.model = ml_collections.ConfigDict(dict(
      out_dim=tc.EMBED, act=act, image=dict(width=64, depth=2, num_heads=2, patch_size=tc.PATCH),
      text=dict(width=32, depth=2, num_heads=2)))
  c.init_shape = (1, tc.RES, tc.RES, 3)
  c.model_init = path
  c.zero_shot = ml_collections.ConfigDict(dict(class_names=["cat", "dog", "tench", "ox"],
                                               templates=["a photo of a {}"], batch_size=8))
  predict, params, head, _ = run_model.build_model(c, log=lambda s: None)
  with jax.default_matmul_precision("highest"):
    _, feats, out = jax.jit(predict.with_out)(params, images)
  text = np.asarray(head.w, np.float64)
  text /= np.linalg.norm(text, axis=0, keepdims=True)
  for lam, temp in ((1.0, 1.0), (0.5, 0.1)):
    det = detectors.build("glmcm", lambda_local=lam, temperature=temp)
    extras = {"layer/local/mcm": np.asarray(out["img/local_mcm"])}
    got = np.asarray(det.score(det.fit(None, head), detectors.Outputs(feats, None, extras=extras)))
    # the official score (higher = ID here): max softmax of the global cosines / T plus lambda
    # times the max over patches and classes of the local softmax (local T = 1, the default)
    g = want_glob / np.linalg.norm(want_glob, axis=1, keepdims=True)
    loc = want_local / np.linalg.norm(want_local, axis=-1, keepdims=True)
    sg = torch.softmax(torch.tensor(g @ text / temp), -1).numpy().max(-1)
    sl = torch.softmax(torch.tensor(loc @ text), -1).numpy().max(axis=(1, 2))
    np.testing.assert_allclose(got, sg + lam * sl, rtol=1e-5)
