"""AdaSCALE-A / -L vs an independent numpy reference of OpenOOD v1.5's adascale postprocessor
(read for facts: OpenOOD @ 3c35632ee91b54b09d1f085d04f94744cece7d0b,
openood/postprocessors/adascale_postprocessor.py, openood/networks/adascale_net.py,
configs/postprocessors/adascale_{a,l}.yml), on a tiny MLP whose input gradient the reference
writes in closed form; plus the pipeline round trip (the fit set's statistics are extracted too).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from fi_jax import detectors, pipeline
from tests.helpers.detector_reference import assert_scores, f64

RTOL = 1e-6
HW, CH, P, D, C = 8, 3, 8 * 8 * 3, 200, 10


def make_mlp(seed=0):
  rng = np.random.default_rng(seed)
  w1 = (rng.normal(size=(P, D)) * 0.2).astype(np.float32)
  b1 = (rng.normal(size=D) * 0.1).astype(np.float32)
  w2 = (rng.normal(size=(D, C)) * 0.3).astype(np.float32)
  b2 = (rng.normal(size=C) * 0.1).astype(np.float32)

  def predict(params, x):
    v = x.reshape(x.shape[0], -1)
    h = jax.nn.relu(jnp.matmul(v, params["w1"], precision="highest") + params["b1"])
    return jnp.matmul(h, params["w2"], precision="highest") + params["b2"], h
  params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
  return predict, params


def images(n, seed, scale=1.0):
  return (np.random.default_rng(seed).normal(size=(n, HW, HW, CH)) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- reference

def ref_stats(params, x, step, k1=5, k2=1, lmbda=10, o=0.05):
  w1, b1, w2, b2 = (f64(params[k]) for k in ("w1", "b1", "w2", "b2"))
  v = f64(x).reshape(len(x), -1)
  pre = v @ w1 + b1
  h = np.maximum(pre, 0)
  y = (h @ w2 + b2).argmax(1)
  g = ((pre > 0) * w2[:, y].T) @ w1.T                      # d z_y / d v, per row
  n_pix = int(P * o)
  mask = np.zeros_like(g)
  np.put_along_axis(mask, np.argsort(np.abs(g), 1, kind="stable")[:, :n_pix], 1.0, 1)
  step_v = np.tile(np.asarray(step, np.float64), HW * HW)   # NHWC flattening: channel fastest
  hp = np.maximum((v + np.sign(g) * mask * step_v) @ w1 + b1, 0)
  kk1, kk2 = int(D * k1 / 100), int(D * k2 / 100)
  order = np.argsort(-h, 1, kind="stable")
  a = np.take_along_axis(np.maximum(hp, 0), order[:, :kk1], 1).sum(1)
  q = np.take_along_axis(np.abs(h - hp), order[:, :kk2], 1).sum(1)
  return h, a + lmbda * q


def ref_adascale(params, fit_x, test_x, step, variant, p_min=75.0, p_max=85.0, **kw):
  _, fit_stat = ref_stats(params, fit_x, step, **kw)
  h, stat = ref_stats(params, test_x, step, **kw)
  ecdf = np.array([(fit_stat <= s).mean() for s in stat])   # statsmodels' ECDF (side='right')
  pct = p_min + (1 - ecdf) * (p_max - p_min)
  x = np.maximum(h, 0)
  k = D - np.round(D * pct / 100).astype(int)
  top = np.array([np.sort(r)[::-1][:kk].sum() for r, kk in zip(x, k)])
  r = x.sum(1) / top
  w2, b2 = f64(params["w2"]), f64(params["b2"])
  if variant == "adascale_l":
    z = (h @ w2 + b2) * (r ** 2)[:, None]
  else:
    z = (h * np.exp(r)[:, None]) @ w2 + b2
  return scipy.special.logsumexp(z, axis=1)


def ours(name, predict, params, fit_x, test_x, input_std=detectors.gradient.IMAGENET_STD, **hp):
  det = detectors.build(name, **hp)
  fn = lambda x: predict(params, x)

  def outputs(x):
    z, h = fn(jnp.asarray(x))
    return detectors.Outputs(h, z, None,
                             {"stat": det.score_inputs({}, fn, x, input_std=input_std)["stat"]})
  head = detectors.Head(params["w2"], params["b2"])
  return np.asarray(det.score(det.fit(outputs(fit_x), head), outputs(test_x)))


@pytest.mark.parametrize("name", ["adascale_a", "adascale_l"])
def test_equals_reference(name):
  predict, params = make_mlp()
  fit_x, test_x = images(300, 1), np.concatenate([images(60, 2), images(60, 3, 3.0)])
  assert_scores(ours(name, predict, params, fit_x, test_x),
                ref_adascale(params, fit_x, test_x, [0.5] * 3, name), rtol=RTOL)
  hp = dict(p_min=60.0, p_max=95.0, k1=10.0, k2=3.0, lmbda=2.0, o=0.2, step=0.3)
  std = (0.5, 0.25, 0.2)
  step = [0.3 * s / t for s, t in zip(detectors.gradient.IMAGENET_STD, std)]
  ref = ref_adascale(params, fit_x, test_x, step, name, p_min=60.0, p_max=95.0, k1=10, k2=3,
                     lmbda=2.0, o=0.2)
  assert_scores(ours(name, predict, params, fit_x, test_x, input_std=std, **hp), ref, rtol=RTOL)


@pytest.mark.slow
def test_pipeline_extracts_fit_stats_and_scores():
  predict, params = make_mlp()
  dets = detectors.build_suite(["adascale_a", "odin", "msp"])
  assert pipeline.input_scorer_names(dets, "id_fit") == ["adascale_a"]
  assert pipeline.input_scorer_names(dets, "id_test") == ["adascale_a", "odin"]
  scorers = pipeline.input_scorers(dets, ["adascale_a", "odin"], predict, (0.229, 0.224, 0.225))
  sets = {}
  for s, x in (("id_fit", images(200, 1)), ("id_test", images(50, 2)),
               ("ood/far", images(50, 3, 3.0))):
    z, h = predict(params, jnp.asarray(x))
    arrays = {"features": np.asarray(h), "logits": np.asarray(z)}
    for n in pipeline.input_scorer_names(dets, s):
      res = scorers[n](params, jnp.asarray(x))
      for col, v in (res.items() if isinstance(res, dict) else [("score", res)]):
        arrays[f"{col}/{n}"] = np.asarray(v)
    sets[s] = arrays
  assert "stat/adascale_a" in sets["id_fit"] and "score/odin" not in sets["id_fit"]
  scores, errors = pipeline.score_sets(dets, sets, detectors.Head(params["w2"], params["b2"]))
  assert not errors
  ref = ref_adascale(params, images(200, 1), images(50, 3, 3.0), [0.5] * 3, "adascale_a")
  assert_scores(scores["adascale_a"]["ood/far"], ref, rtol=RTOL)


@pytest.mark.parametrize("hp,match", [
    ({"p_min": 90.0, "p_max": 80.0}, "p_min"), ({"p_max": 100.0}, "p_max"),
    ({"k1": 0.0}, "k1"), ({"k2": 101.0}, "k2"), ({"lmbda": -1.0}, "lmbda"),
    ({"o": 1.5}, "o"), ({"step": -0.1}, "step")])
def test_hparam_validation(hp, match):
  for name in ("adascale_a", "adascale_l"):
    with pytest.raises(ValueError, match=match):
      detectors.build(name, **hp)


def test_score_needs_the_stat():
  predict, params = make_mlp()
  det = detectors.build("adascale_a")
  z, h = predict(params, jnp.asarray(images(10, 1)))
  with pytest.raises(ValueError, match="extras"):
    det.fit(detectors.Outputs(h, z), detectors.Head(params["w2"], params["b2"]))


def test_streaming_fit_and_state_roundtrip(tmp_path):
  predict, params = make_mlp()
  det = detectors.build("adascale_l")
  fn = lambda x: predict(params, x)
  x = images(120, 1)
  z, h = fn(jnp.asarray(x))
  stat = det.score_inputs({}, fn, x)["stat"]
  head = detectors.Head(params["w2"], params["b2"])
  whole = det.fit(detectors.Outputs(h, z, None, {"stat": stat}), head)
  parts = [detectors.Outputs(h[i:i + 50], z[i:i + 50], None, {"stat": stat[i:i + 50]})
           for i in range(0, 120, 50)]
  streamed = det.fit(iter(parts), head)
  detectors.save_state(str(tmp_path / "s.npz"), streamed)
  loaded = detectors.load_state(str(tmp_path / "s.npz"))
  test = detectors.Outputs(h, z, None, {"stat": stat})
  np.testing.assert_array_equal(np.asarray(det.score(whole, test)),
                                np.asarray(det.score(loaded, test)))


# ----------------------------------------------------------------------------- ranking

def make_sensitive_mlp():
  """A one-hidden-layer ReLU net whose OOD inputs' features are sensitive to AdaSCALE's
  perturbation while its logits are not told apart. Inputs: half A (class signal), half B
  (constant: 0 for ID, -0.05 for OOD). Hidden units: 193 class units (A -> logits), two 'probe'
  units (bias 8, weight +1 on the first 48 B entries and -1 on the others, no logit weight), four
  'gate' units (weight 1 on every B entry, bias 0.01: active only when B = 0, i.e. for ID, where
  they give the B entries a large input gradient) and one always-active unit with weight 1e-5
  on B. For OOD the B entries have the smallest input gradients (1e-5), so the perturbation
  moves the first B entries by +step and the probe units by +4.5 each: Q' jumps; for ID it
  moves A entries and the probes stay. Constant B leaves the probes, the logits and the
  softmax alike for ID and OOD (the gates add 0.04 to every ID logit)."""
  rng = np.random.default_rng(0)
  a = np.arange(P) < P // 2
  b_idx = np.flatnonzero(~a)
  probe, gate, tiny = np.arange(D) < 2, (np.arange(D) >= 2) & (np.arange(D) < 6), np.arange(D) == 6
  cls = ~(probe | gate | tiny)
  w1, b1, w2 = np.zeros((P, D)), np.zeros(D), np.zeros((D, C))
  w1[np.ix_(a, cls)] = rng.normal(size=(a.sum(), cls.sum())) * 0.1
  b1[cls] = rng.normal(size=cls.sum()) * 0.1 + 3.0
  w2[cls] = rng.normal(size=(cls.sum(), C)) * 0.3
  w1[np.ix_(b_idx[:48], probe)], w1[np.ix_(b_idx[48:], probe)], b1[probe] = 1.0, -1.0, 8.0
  w1[np.ix_(~a, gate)], b1[gate], w2[gate] = 1.0, 0.01, 1.0
  w1[np.ix_(~a, tiny)], b1[tiny], w2[tiny] = 1e-5, 0.01, 1.0
  params = {k: v.astype(np.float32) for k, v in
            dict(w1=w1, b1=b1, w2=w2, b2=rng.normal(size=C) * 0.1).items()}
  predict, _ = make_mlp()
  return predict, params


def two_part_images(n, seed, b_value):
  v = np.concatenate([np.random.default_rng(seed).normal(size=(n, P // 2)),
                      np.full((n, P // 2), b_value)], 1)
  return v.reshape(n, HW, HW, CH).astype(np.float32)


@pytest.mark.slow
def test_adascale_beats_msp_when_ood_features_are_perturbation_sensitive():
  """On make_sensitive_mlp: OOD's Q' lies above every fit Q', so AdaSCALE uses the lowest
  percentile for it; MSP, Energy and SCALE (a fixed percentile) are at chance."""
  from sklearn.metrics import roc_auc_score
  predict, params = make_sensitive_mlp()
  fn = lambda x: predict(params, x)
  head = detectors.Head(params["w2"], params["b2"])
  fit_x, id_x, ood_x = (two_part_images(300, 1, 0.0), two_part_images(150, 2, 0.0),
                        two_part_images(150, 3, -0.05))
  stat = lambda x: np.asarray(detectors.build("adascale_a").score_inputs({}, fn, x)["stat"])
  assert stat(ood_x).min() > stat(fit_x).max() + 50                  # measured 151 vs 62

  def auroc(name):
    det = detectors.build(name)

    def outputs(x):
      z, h = fn(jnp.asarray(x))
      extras = {"stat": det.score_inputs({}, fn, x)["stat"]} if "inputs" in det.needs else None
      return detectors.Outputs(h, z, None, extras)
    state = det.fit(outputs(fit_x), head)
    s_id, s_ood = np.asarray(det.score(state, outputs(id_x))), np.asarray(
        det.score(state, outputs(ood_x)))
    return roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])
  a = {n: auroc(n) for n in ("msp", "energy", "scale", "adascale_a", "adascale_l")}
  assert max(a["msp"], a["energy"], a["scale"]) < 0.6, a             # measured 0.51 / 0.52 / 0.53
  assert a["adascale_a"] > 0.75 and a["adascale_l"] > 0.7, a         # measured 0.80 / 0.75
