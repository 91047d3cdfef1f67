"""Second-wave feature / logit detectors (mds_pp, rmds_pp, ssd, neco, relation, openmax, vra) vs
independent numpy / scipy / scikit-learn references of the papers and official code.

Hyper-parameters and formulas were read from OpenOOD at commit
3c35632ee91b54b09d1f085d04f94744cece7d0b (configs/postprocessors/{relation,vra,ssd}.yml,
openood/postprocessors/{openmax,relation,vra,ssd}_postprocessor.py), libMR 0.1.9 (MR.fit_high,
weibull_fit) and the NECO authors' code (StandardScaler -> PCA -> norm ratio x max logit).
Every score must equal its reference within 1e-6 relative on ReLU-like and signed features, beat
MSP on a synthetic case built so that the method's signal is there and MSP's is not, and keep
its scores inside `detectors.shared()` (streaming fit and state files: test_detectors.py, which
runs every registered detector).
"""
import numpy as np
import pytest
import scipy.spatial.distance as spd
import scipy.optimize
import scipy.special
import scipy.stats
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from fi_jax import detectors
from fi_jax.detectors import openmax as openmax_lib
from test_detectors import C, D, assert_scores, f64, fit_score, make_data, ref_mds, softmax

NEW = ("mds_pp", "rmds_pp", "ssd", "neco", "relation", "openmax", "vra")
RTOL = 1e-6


@pytest.fixture(scope="module", params=[False, True], ids=["relu", "signed"])
def data(request):
  return make_data(request.param)


def normalized(out):
  h = f64(out.features)
  return detectors.Outputs(h / np.linalg.norm(h, axis=1, keepdims=True), out.logits, out.labels)


# ----------------------------------------------------------------------------- references

def ref_ssd(fit, test):
  return -EmpiricalCovariance(assume_centered=False).fit(f64(fit.features)).mahalanobis(
      f64(test.features))


def ref_rmds_on(fit, test):
  bg = EmpiricalCovariance(assume_centered=False).fit(f64(fit.features))
  return ref_mds(fit, test) + bg.mahalanobis(f64(test.features))


def ref_neco(fit, test, dim, maxlogit=True):
  ss = StandardScaler().fit(f64(fit.features))
  pca = PCA(n_components=f64(fit.features).shape[1]).fit(ss.transform(f64(fit.features)))
  full = ss.transform(f64(test.features))
  red = pca.transform(full)[:, :dim]
  s = np.linalg.norm(red, axis=1) / np.linalg.norm(full, axis=1)
  return s * f64(test.logits).max(1) if maxlogit else s


def ref_relation(fit, test, power=1, thres=0.03):
  nrm = lambda x: f64(x) / np.sqrt((f64(x) ** 2).sum(-1) + 1e-10)[:, None]
  rel = (np.clip(nrm(test.features) @ nrm(fit.features).T, 0.0, None)
         * (softmax(f64(test.logits)) @ softmax(f64(fit.logits)).T))
  rel = np.where(np.abs(rel) > thres, rel, 0.0)
  return (np.sign(rel) * np.abs(rel) ** power).sum(-1)


def ref_weibull(tail):
  """libMR fit_high's (scale, shape, small): the maximum-likelihood Weibull (loc 0) of
  y = tail + 1 - min(tail), from the profile likelihood equation in the shape k,
  sum y^k log y / sum y^k - 1/k - mean(log y) = 0 (scipy brentq), scale = mean(y^k)^(1/k).
  (scipy.stats.weibull_min.fit(y, floc=0) reaches the same optimum only to ~1e-5.)"""
  small = np.min(tail)
  ly = np.log(np.asarray(tail, np.float64) + 1.0 - small)

  def eq(k):
    w = np.exp(k * (ly - ly.max()))
    return (w * ly).sum() / w.sum() - 1.0 / k - ly.mean()
  k = scipy.optimize.brentq(eq, 1e-3, 1e6, xtol=1e-14, rtol=1e-15, maxiter=500)
  scale = np.exp(ly.max() + np.log(np.mean(np.exp(k * (ly - ly.max())))) / k)
  return scale, k, small


def ref_openmax(fit, test, tail=20, alpha=3):
  z, y = f64(fit.logits), np.asarray(fit.labels)
  ok = (z.argmax(1) == y)
  models = {}
  for c in range(C):
    rows = z[ok & (y == c)]
    if len(rows) < 2:
      continue
    mav = rows.mean(0)
    dists = np.array([spd.euclidean(mav, r) for r in rows])
    models[c] = (mav, ref_weibull(np.sort(dists)[-tail:]))
  out = []
  for s in f64(test.logits):
    ranked = s.argsort()[::-1][:alpha]
    omega = np.zeros(C)
    omega[ranked] = [(alpha + 1 - i) / alpha for i in range(1, alpha + 1)]
    mod, unk = np.array(s), 0.0
    for c, (mav, (scale, shape, small)) in models.items():
      x = spd.euclidean(mav, s) + 1.0 - small
      w = 0.0 if x < 0 else 1.0 - np.exp(-(x / scale) ** shape)
      mod[c] = s[c] * (1 - w * omega[c])
      unk += s[c] - mod[c]
    e = np.exp(np.r_[mod, unk] - max(mod.max(), unk))
    out.append(-e[-1] / e.sum())
  return np.array(out)


def ref_vra(fit, test, head, lo, hi, mode):
  a, b = np.percentile(f64(fit.features).astype(np.float32).reshape(-1), [lo, hi])
  h = f64(test.features)
  g = np.clip(h, a, b) if mode == "clip" else np.where(h < a, 0.0, np.minimum(h, b))
  return scipy.special.logsumexp(g @ f64(head.w) + f64(head.b), axis=1)


# ----------------------------------------------------------------------------- equality

def test_mds_pp_rmds_pp(data):
  fit, test, head = data
  assert_scores(fit_score("mds_pp", fit, test, head), ref_mds(normalized(fit), normalized(test)),
                rtol=RTOL)
  assert_scores(fit_score("rmds_pp", fit, test, head),
                ref_rmds_on(normalized(fit), normalized(test)), rtol=RTOL)
  # without the head the class count comes from the logits
  det = detectors.build("mds_pp")
  np.testing.assert_array_equal(np.asarray(det.score(det.fit(fit), test)),
                                fit_score("mds_pp", fit, test, head))


def test_ssd(data):
  fit, test, head = data
  assert_scores(fit_score("ssd", fit, test, head), ref_ssd(fit, test), rtol=RTOL)
  # labels are not read
  unlabelled = detectors.Outputs(fit.features, fit.logits)
  assert_scores(fit_score("ssd", unlabelled, test, head), ref_ssd(fit, test), rtol=RTOL)


@pytest.mark.parametrize("dim", [1, 10, D])
def test_neco(data, dim):
  fit, test, head = data
  assert_scores(fit_score("neco", fit, test, head, dim=dim), ref_neco(fit, test, dim), rtol=RTOL)
  assert_scores(fit_score("neco", fit, test, head, dim=dim, maxlogit=False),
                ref_neco(fit, test, dim, False), rtol=RTOL)


def test_neco_constant_column_is_kept_like_standard_scaler(data):
  fit, test, head = data
  h = np.array(fit.features)
  h[:, 3] = 2.5
  ht = np.array(test.features)
  ht[:, 3] = 2.5 + np.linspace(-1, 1, len(ht), dtype=np.float32)
  fit2 = detectors.Outputs(h, fit.logits, fit.labels)
  test2 = detectors.Outputs(ht, test.logits, test.labels)
  assert_scores(fit_score("neco", fit2, test2, head, dim=10), ref_neco(fit2, test2, 10), rtol=RTOL)


@pytest.mark.parametrize("power,thres", [(1, 0.03), (2, 0.03), (1, 0.0)])
def test_relation(data, power, thres):
  fit, test, head = data
  ref = ref_relation(fit, test, power, thres)
  assert_scores(fit_score("relation", fit, test, head, pow=power, thres=thres), ref, rtol=RTOL)
  # several query and bank blocks, the last bank block clamped and masked
  assert_scores(fit_score("relation", fit, test, head, pow=power, thres=thres, query_block=32,
                          bank_block=70), ref, rtol=RTOL)


def test_openmax(data):
  fit, test, head = data
  assert_scores(fit_score("openmax", fit, test, head), ref_openmax(fit, test), rtol=RTOL)
  assert_scores(fit_score("openmax", fit, test, head, tail=5, alpha=1),
                ref_openmax(fit, test, 5, 1), rtol=RTOL)


# libMR 0.1.9 MR().fit_high(tail, len(tail)).get_params() (scale, shape, small) and w_score at
# (tail[0], tail[10], tail[-1] + 0.5), computed with the library (it does not build here).
_LIBMR = [
    ([0.720854, 0.727012, 0.757486, 0.761765, 0.765068, 0.768417, 0.773572, 0.827029, 0.844102,
      0.873048, 0.88051, 0.920868, 0.950611, 0.99621, 0.998873, 1.000208, 1.017664, 1.064284,
      1.122378, 1.25838],
     (1.2465364975965654, 8.106461344931507, 0.720854),
     (0.15427438061469245, 0.42692627552892304, 1.0)),
    ([4.930444, 4.931392, 5.058356, 5.066015, 5.130033, 5.165915, 5.199397, 5.450265, 5.612627,
      5.637025, 5.840035, 5.856753, 5.90639, 6.046548, 6.075483, 6.329941, 6.601247, 6.773192,
      7.840678, 9.754315],
     (2.3048768059468085, 1.9509236264787861, 4.930444),
     (0.17807902046670177, 0.4998162503179161, 0.999226086853261)),
    ([30.587434, 31.149242, 31.153572, 31.750664, 31.880595, 33.292034, 33.42705, 34.437575,
      34.959359, 36.12719, 36.708986, 37.224056, 37.334669, 37.876143, 37.981225, 38.164341,
      41.505466, 50.650393, 50.738591, 56.391388],
     (8.704792604699703, 1.2397530148731764, 30.587434),
     (0.066094854210068, 0.5414450144051207, 0.9838476559884348)),
]


def test_weibull_fit_equals_mle_and_libmr():
  """The fit equals scipy's MLE (the quantity libMR estimates) within 1e-6; libMR itself stops
  its root finder at 1e-6 absolute on the normalised Gumbel scale, so it is matched within 1e-5."""
  rng = np.random.default_rng(3)
  tails = [np.sort(np.abs(rng.normal(size=100)) * s)[-20:] for s in (0.05, 1.0, 30.0)]
  tails += [np.array(t) for t, _, _ in _LIBMR]
  scale, shape, small, valid = openmax_lib.weibull_fit_high(np.stack(tails),
                                                            np.ones((len(tails), 20), bool))
  assert valid.all()
  for i, t in enumerate(tails):
    np.testing.assert_allclose((scale[i], shape[i], small[i]), ref_weibull(t), rtol=1e-6)
    # the maximum: scipy's own fit has no larger likelihood
    y = t + 1.0 - t.min()
    k, _, lam = scipy.stats.weibull_min.fit(y, floc=0.0)
    ll = lambda k, lam: scipy.stats.weibull_min.logpdf(y, k, scale=lam).sum()
    assert ll(shape[i], scale[i]) >= ll(k, lam) - 1e-12
  for i, (t, params, w) in enumerate(_LIBMR):
    j = 3 + i
    np.testing.assert_allclose((scale[j], shape[j], small[j]), params, rtol=1e-5)
    x = np.array([t[0], t[10], t[-1] + 0.5]) + 1.0 - small[j]
    np.testing.assert_allclose(1 - np.exp(-(x / scale[j]) ** shape[j]), w, rtol=1e-5, atol=1e-9)
  # a short tail (masked entries) equals the fit of the entries alone; < 2 entries: not valid
  mask = np.zeros((2, 20), bool)
  mask[0, :7] = True
  mask[1, :1] = True
  sc, sh, sm, ok = openmax_lib.weibull_fit_high(np.stack(tails[:2]), mask)
  np.testing.assert_allclose((sc[0], sh[0], sm[0]), ref_weibull(tails[0][:7]), rtol=1e-6)
  assert ok.tolist() == [True, False]


@pytest.mark.parametrize("preset,mode", [(None, "zero"), ("openood", "clip")])
def test_vra(data, preset, mode):
  fit, test, head = data
  assert_scores(fit_score("vra", fit, test, head, preset=preset),
                ref_vra(fit, test, head, 10.0, 90.0, mode), rtol=RTOL)
  assert_scores(fit_score("vra", fit, test, head, preset=preset, percentile_low=30.0,
                          percentile_high=95.0), ref_vra(fit, test, head, 30.0, 95.0, mode),
                rtol=RTOL)


# ----------------------------------------------------------------------------- beats MSP

def _auroc(det_name, fit, test_id, test_ood, head, **hp):
  det = detectors.build(det_name, **hp)
  state = det.fit(fit, head)
  s_id, s_ood = np.asarray(det.score(state, test_id)), np.asarray(det.score(state, test_ood))
  return roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])


def _same_logits_ood(test, features):
  """OOD rows carrying the ID rows' own logits (MSP cannot separate them: AUROC 0.5)."""
  return detectors.Outputs(features.astype(np.float32), test.logits)


@pytest.mark.parametrize("name,hp", [("mds_pp", {}), ("rmds_pp", {}), ("ssd", {}),
                                     ("neco", {"dim": 11}), ("relation", {})])
def test_feature_methods_beat_msp_when_only_features_differ(name, hp):
  """ID features on a low-dimensional class structure; OOD features are isotropic noise of the
  same norm with the ID rows' logits, so MSP is at chance and the feature signal is all."""
  fit, test, head = make_data(True, seed=5)
  rng = np.random.default_rng(1)
  ood = rng.normal(size=test.features.shape)
  ood *= (np.linalg.norm(test.features, axis=1) / np.linalg.norm(ood, axis=1))[:, None]
  ood_out = _same_logits_ood(test, ood)
  msp = _auroc("msp", fit, test, ood_out, head)
  assert abs(msp - 0.5) < 1e-9
  assert _auroc(name, fit, test, ood_out, head, **hp) > 0.8      # measured: 0.83 (neco) to 1.0


def test_openmax_beats_msp_on_overconfident_outliers():
  """OOD logits are ID logits scaled up: more confident (MSP prefers them) but far from every
  class's mean activation vector (OpenMax's Weibull models flag them)."""
  fit, test, head = make_data(False, seed=6)
  ood = detectors.Outputs(test.features, np.asarray(test.logits) * 4.0)
  assert _auroc("msp", fit, test, ood, head) < 0.2                # measured 0.17
  assert _auroc("openmax", fit, test, ood, head) > 0.8            # measured 0.87


def test_vra_beats_msp_on_activation_spikes():
  """OOD features are weaker ID features plus a few very large units aligned with one class
  (the ReAct/VRA picture): MSP is confident on them, VRA's rectification removes the spikes."""
  fit, test, head = make_data(False, seed=7)
  h = 0.3 * np.asarray(test.features, np.float64)
  w = np.asarray(head.w, np.float64)
  rng = np.random.default_rng(2)
  for i in range(len(h)):
    c = rng.integers(0, C - 1)
    units = np.argsort(-w[:, c])[:3]
    h[i, units] += 40.0
  z = h @ w + np.asarray(head.b, np.float64)
  ood = detectors.Outputs(h.astype(np.float32), z.astype(np.float32))
  assert _auroc("msp", fit, test, ood, head) < 0.1                # measured 0.0
  assert _auroc("vra", fit, test, ood, head) > 0.7                # measured 0.74


# ----------------------------------------------------------------------------- API, sharing

def test_presets_and_validation():
  assert detectors.hparams_of("relation", "openood")["pow"] == 1
  assert detectors.hparams_of("vra", "openood")["mode"] == "clip"
  assert detectors.hparams_of("vra", None)["mode"] == "zero"
  assert detectors.hparams_of("openmax", "openood") == {"tail": 20, "alpha": 3,
                                                         "max_rows": 1_000_000, "seed": 0}
  assert detectors.hparams_of("neco", None)["dim"] == 100
  for name, bad, match in (("neco", {"dim": 0}, "dim"), ("neco", {"maxlogit": 1}, "maxlogit"),
                           ("relation", {"pow": 0}, "pow"), ("relation", {"thres": -1.0}, "thres"),
                           ("openmax", {"tail": 1}, "tail"), ("openmax", {"alpha": 0}, "alpha"),
                           ("vra", {"percentile_low": 95.0}, "percentile_low"),
                           ("vra", {"percentile_high": 101.0}, "percentile"),
                           ("vra", {"mode": "relu"}, "mode")):
    with pytest.raises(ValueError, match=match):
      detectors.build(name, **bad)
  fit, test, head = make_data(False)
  with pytest.raises(ValueError, match="dim=100 > feature dimension 48"):
    detectors.build("neco").fit(fit, head)
  with pytest.raises(ValueError, match="labels"):
    detectors.build("openmax").fit(detectors.Outputs(fit.features, fit.logits), head)


def test_shared_scope_identical_and_shares_work(monkeypatch):
  """Inside detectors.shared(): the new detectors (with MDS/RMDS/KNN/ReAct beside them) score
  exactly as alone; MDS++ and RMDS++ share one pass over the normalised features, SSD and NECO
  one plain pass, Relation reuses KNN's bank and VRA ReAct's sampled rows."""
  from fi_jax.detectors import stats
  fit, test, head = make_data(True, seed=2)
  runs = [(n, p) for n in NEW + ("mds", "rmds", "knn", "react") for p in detectors.PRESETS]
  hp = lambda n: {"dim": 10} if n == "neco" else {}
  alone = {r: fit_score(r[0], fit, test, head, preset=r[1], **hp(r[0])) for r in runs}
  calls = {"moments": 0}
  real = stats._moments

  def counted(*a, **kw):
    calls["moments"] += 1
    return real(*a, **kw)
  monkeypatch.setattr(stats, "_moments", counted)
  dets = {r: detectors.build(r[0], preset=r[1], **hp(r[0])) for r in runs}
  with detectors.shared(dets.values()) as scope:
    states = {r: d.fit(fit, head) for r, d in dets.items()}
    together = {r: np.asarray(d.score(states[r], test)) for r, d in dets.items()}
    assert scope.hits > 0
  for r in runs:
    np.testing.assert_array_equal(together[r], alone[r], err_msg=str(r))
  # mds/rmds (labels), mds_pp/rmds_pp (normalised, labels), ssd/neco (plain), openmax (logits)
  assert calls["moments"] == 4
  assert states[("relation", "ninco")]["bank"] is states[("knn", "ninco")]["bank"]
