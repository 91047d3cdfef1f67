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
import scipy.optimize
import scipy.spatial.distance as spd
import scipy.special
import scipy.stats
from sklearn.covariance import EmpiricalCovariance
from sklearn.decomposition import PCA
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from fi_jax import detectors
from fi_jax.detectors import openmax as openmax_lib
from tests.helpers.detector_reference import (
  C,
  D,
  assert_scores,
  f64,
  fit_score,
  make_data,
  ref_mds,
  softmax,
)

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
  """libMR 0.1.9 fit_high's (scale, shape, small), by scipy: y = tail + 1 - min(tail),
  x0 = (log y - max) / range; the Gumbel scale sigma is the root of libMR's likelihood equation
  in the bracket libMR grows from sqrt(6) std(x0) / pi (halving / doubling), found by scipy's
  Brent solver with libMR's stopping tolerance (|half bracket| <= 2 * 1e-6: xtol = 4e-6);
  mu = sigma log mean e^(x0/sigma); scale = e^(range mu + max), shape = 1 / (range sigma).
  Checked against the library's own output (_LIBMR) within 1e-9."""
  small = np.min(tail)
  x = np.log(np.asarray(tail, np.float64) + 1.0 - small)
  rng = x.max() - x.min()
  x0 = (x - x.max()) / rng
  eq = lambda s: s + x0.mean() - (np.exp(x0 / s) * x0).sum() / np.exp(x0 / s).sum()
  s0 = np.sqrt(6.0) * x0.std(ddof=1) / np.pi
  lo, hi = (0.5 * s0, s0) if eq(s0) > 0 else (s0, 2.0 * s0)
  while eq(lo) > 0:
    lo, hi = 0.5 * lo, lo
  while eq(hi) < 0:
    lo, hi = hi, 2.0 * hi
  sig = scipy.optimize.brentq(eq, lo, hi, xtol=4e-6, rtol=8.9e-16)
  mu = sig * np.log(np.mean(np.exp(x0 / sig)))
  return np.exp(rng * mu + x.max()), 1.0 / (rng * sig), small


def mle_weibull(tail):
  """The exact maximum-likelihood Weibull (loc 0) of y = tail + 1 - min(tail): the root of the
  profile equation sum y^k log y / sum y^k - 1/k - mean(log y) = 0 in the shape k."""
  ly = np.log(np.asarray(tail, np.float64) + 1.0 - np.min(tail))

  def eq(k):
    w = np.exp(k * (ly - ly.max()))
    return (w * ly).sum() / w.sum() - 1.0 / k - ly.mean()
  k = scipy.optimize.brentq(eq, 1e-3, 1e6, xtol=1e-14, rtol=1e-15, maxiter=500)
  scale = np.exp(ly.max() + np.log(np.mean(np.exp(k * (ly - ly.max())))) / k)
  return scale, k, np.min(tail)


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


@pytest.mark.slow
@pytest.mark.parametrize("power,thres", [(1, 0.03), (2, 0.03), (1, 0.0)])
def test_relation(data, power, thres):
  fit, test, head = data
  ref = ref_relation(fit, test, power, thres)
  assert_scores(fit_score("relation", fit, test, head, pow=power, thres=thres), ref, rtol=RTOL)
  # several query and bank blocks, the last bank block clamped and masked
  assert_scores(fit_score("relation", fit, test, head, pow=power, thres=thres, query_block=32,
                          bank_block=70), ref, rtol=RTOL)


def near_cutoff_data(thres=0.03, seed=0):
  """float64 fit / test rows where many pairs have r_ij within 1e-11..1e-9 of thres (a float32
  kernel decides about half of them wrongly), as (fit, test, adversarial pair mask). Queries
  0-7: 8 near-cut-off bank rows each (bank rows 0-63); queries 8-10: one each (rows 64-66);
  queries 16-23 are one query repeated, and each of bank rows 128-191 is near the cut-off for
  all eight of them (512 pairs in one 8 x 64 block pair); the other rows are random."""
  rng = np.random.default_rng(seed)
  d, c, n_fit, n_test = 48, 12, 256, 32
  ht, zt = rng.normal(size=(n_test, d)), 3.0 * rng.normal(size=(n_test, c))
  ht[16:24], zt[16:24] = ht[16], zt[16]
  hf, zf = rng.normal(size=(n_fit, d)), 3.0 * rng.normal(size=(n_fit, c))
  owner = np.full(n_fit, -1)
  owner[:64], owner[64:67], owner[128:192] = np.arange(64) // 8, [8, 9, 10], 16
  ft = ht / np.linalg.norm(ht, axis=1, keepdims=True)
  for j in np.flatnonzero(owner >= 0):
    i = owner[j]
    zf[j] = zt[i] + 0.1 * rng.normal(size=c)
    pp = softmax(zt[i:i + 1]) @ softmax(zf[j:j + 1]).T
    s = (thres + rng.choice([-1, 1]) * 10 ** rng.uniform(-11, -9)) / pp[0, 0]
    v = rng.normal(size=d)
    v -= (v @ ft[i]) * ft[i]
    hf[j] = (s * ft[i] + np.sqrt(1 - s * s) * v / np.linalg.norm(v)) * rng.uniform(0.5, 2)
  fit, test = detectors.Outputs(hf, zf), detectors.Outputs(ht, zt)
  mask = np.zeros((n_test, n_fit), bool)
  mask[owner[owner >= 0], np.flatnonzero(owner >= 0)] = True
  mask[16:24, 128:192] = True
  return fit, test, mask


@pytest.fixture
def small_fix_caps(monkeypatch):
  """Relation's float64 recomputation capacities lowered to 4 and 64 pairs a block pair (so the
  near-cut-off data takes every branch: none, <= 4, <= 64 and the dense float64 block)."""
  from fi_jax.detectors import knn as knn_lib
  knn_lib.relation_sums.clear_cache()
  monkeypatch.setattr(knn_lib, "_FIX_CAPS", (4, 64))
  yield
  knn_lib.relation_sums.clear_cache()


@pytest.mark.slow
@pytest.mark.parametrize("caps", ["default", "small"])
@pytest.mark.parametrize("power", [1, 2])
def test_relation_pairs_at_the_cutoff(caps, power, request):
  """Pairs within 1e-9 of the cut-off are decided as in float64 (the float32 kernels alone get
  many of them wrong: checked here), in every recomputation branch."""
  if caps == "small":
    request.getfixturevalue("small_fix_caps")
  fit, test, mask = near_cutoff_data()
  ref = ref_relation(fit, test, power, 0.03)
  nrm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  r64 = (np.clip(nrm(test.features) @ nrm(fit.features).T, 0, None)
         * (softmax(test.logits) @ softmax(fit.logits).T))
  f32 = lambda x: np.asarray(x, np.float32)
  r32 = (np.clip(f32(nrm(test.features)) @ f32(nrm(fit.features)).T, 0, None)
         * (f32(softmax(test.logits)) @ f32(softmax(fit.logits)).T))
  assert (np.abs(r64 - 0.03)[mask] < 2e-9).all()
  assert ((r32 > 0.03) != (r64 > 0.03))[mask].sum() >= 20         # float32 alone flips pairs
  for hp in ({}, {"query_block": 8, "bank_block": 64}):
    assert_scores(fit_score("relation", fit, test, None, pow=power, **hp), ref, rtol=RTOL)


def test_openmax(data):
  fit, test, head = data
  assert_scores(fit_score("openmax", fit, test, head), ref_openmax(fit, test), rtol=RTOL)
  assert_scores(fit_score("openmax", fit, test, head, tail=5, alpha=1),
                ref_openmax(fit, test, 5, 1), rtol=RTOL)


# libMR 0.1.9 MR().fit_high(tail, len(tail)).get_params() (scale, shape, small) and w_score at
# (tail[0], tail[len // 2], tail[-1] + 0.5) (the first three at tail[10]), computed with the
# library itself (`pip install libmr==0.1.9` in a separate venv; numpy tails: the first three
# hand-picked, the rest seeded draws rounded to 6-9 digits: |normal| x 0.05, 1, 30, gamma(0.5),
# gamma(3), uniform(5, 5.001), |cauchy|, a 7-entry normal tail).
_LIBMR = [
    ([
      0.720854, 0.727012, 0.757486, 0.761765, 0.765068, 0.768417, 0.773572, 0.827029,
      0.844102, 0.873048, 0.88051, 0.920868, 0.950611, 0.99621, 0.998873, 1.000208,
      1.017664, 1.064284, 1.122378, 1.25838],
     (1.2465364975965654, 8.106461344931507, 0.720854),
     (0.15427438061469245, 0.42692627552892304, 1.0)),
    ([
      4.930444, 4.931392, 5.058356, 5.066015, 5.130033, 5.165915, 5.199397, 5.450265,
      5.612627, 5.637025, 5.840035, 5.856753, 5.90639, 6.046548, 6.075483, 6.329941,
      6.601247, 6.773192, 7.840678, 9.754315],
     (2.3048768059468085, 1.9509236264787861, 4.930444),
     (0.17807902046670177, 0.4998162503179161, 0.999226086853261)),
    ([
      30.587434, 31.149242, 31.153572, 31.750664, 31.880595, 33.292034, 33.42705, 34.437575,
      34.959359, 36.12719, 36.708986, 37.224056, 37.334669, 37.876143, 37.981225, 38.164341,
      41.505466, 50.650393, 50.738591, 56.391388],
     (8.704792604699703, 1.2397530148731764, 30.587434),
     (0.066094854210068, 0.5414450144051207, 0.9838476559884348)),
    ([
      0.068504, 0.07028, 0.070298, 0.073019, 0.077291, 0.079532, 0.081943, 0.083431,
      0.084091, 0.085909, 0.086501, 0.096754, 0.100999, 0.101708, 0.102046, 0.1079,
      0.124695, 0.127783, 0.141408, 0.16615],
     (1.0415389285712031, 34.482646023521774, 0.068504),
     (0.2178859123731196, 0.3652929393648825, 1.0)),
    ([
      1.190186, 1.302071, 1.335011, 1.36855, 1.496737, 1.498655, 1.504947, 1.526159,
      1.609663, 1.615682, 1.695208, 1.759926, 2.039504, 2.047886, 2.090485, 2.160906,
      2.175575, 2.279026, 2.463132, 2.550035],
     (1.7518876165088124, 4.3786976488377585, 1.190186),
     (0.08227165477229648, 0.4020454049281519, 0.9998063868552676)),
    ([
      36.93699, 38.097802, 38.570922, 44.669322, 46.034764, 48.247269, 48.965226, 52.312638,
      52.693813, 53.027973, 53.043381, 54.807115, 55.115948, 55.337152, 57.021652,
      58.530773, 64.150218, 67.244446, 68.419826, 68.873364],
     (19.031437018786004, 1.7565981326756903, 36.93699),
     (0.005639687992011644, 0.5635909426218169, 0.932190884979201)),
    ([
      2.697909, 2.794633, 2.799005, 2.869613, 2.879112, 2.898321, 2.960168, 3.249453,
      3.330185, 3.44628, 3.675324, 4.100644, 4.181749, 4.573936, 4.70757, 5.166545,
      5.902558, 6.077318, 8.809152, 12.829224],
     (3.0963040974287765, 1.3572147597263713, 2.697909),
     (0.19401079886519845, 0.41964297542581985, 0.9975874722023644)),
    ([
      10.63156, 10.730181, 11.038708, 11.042122, 11.164047, 11.357539, 11.657226, 11.797475,
      11.813247, 11.861313, 12.684887, 12.702294, 12.737512, 13.80611, 13.858756, 13.88454,
      14.888518, 15.574328, 16.018611, 24.019713],
     (3.921952416806368, 1.398989717570579, 10.63156),
     (0.13740281736653182, 0.5056509228428392, 0.9984411554333489)),
    ([
      5.000573071, 5.000644337, 5.000669492, 5.000703183, 5.000763356, 5.000766598,
      5.000772958, 5.00077299, 5.000785328, 5.000835102, 5.000886972, 5.000914304,
      5.000923895, 5.000931982, 5.00094426, 5.00094507, 5.000961903, 5.000979019,
      5.00099155, 5.000996191],
     (1.0003236759039675, 10140.450189454832, 5.000573071),
     (0.03686797820146481, 0.5957253837689676, 1.0)),
    ([
      17.740011, 20.473181, 20.812282, 21.921212, 22.966408, 23.167838, 25.386602,
      26.611586, 28.809173, 28.996624, 38.822692, 43.240732, 44.844091, 73.660116,
      104.961432, 126.092645, 228.829531, 284.683953, 674.941574, 6312.035266],
     (83.2396970210971, 0.4257053299190968, 17.740011),
     (0.14121071704907895, 0.43358457948362317, 0.9981754007366479)),
    ([
      10.633753, 10.649952, 10.671936, 11.233278, 11.382136, 11.988347, 12.145152],
     (1.8104833768563273, 3.0069309626405083, 10.633753),
     (0.15448937926078354, 0.4979199852429268, 0.9901273645048975)),
]


def test_weibull_fit_equals_libmr():
  """The fit equals libMR's parameters (the library's own output) and scipy's reproduction of
  libMR's solver to 1e-9 relative, and is within libMR's root tolerance of the exact MLE."""
  tails = [np.array(t) for t, _, _ in _LIBMR]
  n = max(len(t) for t in tails)
  mask = np.array([[j < len(t) for j in range(n)] for t in tails])
  scale, shape, small, valid = openmax_lib.weibull_fit_high(
      np.stack([np.pad(t, (0, n - len(t))) for t in tails]), mask)
  assert valid.all()
  for i, (t, params, w) in enumerate(_LIBMR):
    got = (scale[i], shape[i], small[i])
    np.testing.assert_allclose(got, params, rtol=1e-9)
    np.testing.assert_allclose(got, ref_weibull(t), rtol=1e-9)
    np.testing.assert_allclose(ref_weibull(t), params, rtol=1e-9)
    np.testing.assert_allclose(got, mle_weibull(t), rtol=3e-5)
    mid = t[10] if i < 3 else t[len(t) // 2]
    x = np.array([t[0], mid, t[-1] + 0.5]) + 1.0 - small[i]
    with np.errstate(over="ignore"):
      np.testing.assert_allclose(1 - np.exp(-(x / scale[i]) ** shape[i]), w, rtol=1e-9,
                                 atol=1e-12)
  rng = np.random.default_rng(3)
  tails = [np.sort(np.abs(rng.normal(size=100)) * s)[-20:] for s in (0.05, 1.0, 30.0)]
  # a short tail (masked entries) equals the fit of the entries alone; < 2 entries: not valid
  mask = np.zeros((2, 20), bool)
  mask[0, :7] = True
  mask[1, :1] = True
  sc, sh, sm, ok = openmax_lib.weibull_fit_high(np.stack(tails[:2]), mask)
  np.testing.assert_allclose((sc[0], sh[0], sm[0]), ref_weibull(tails[0][:7]), rtol=1e-9)
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
  one plain pass, Relation's presets share one float64 bank and VRA ReAct's sampled rows."""
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
  assert states[("relation", "ninco")]["bank"] is states[("relation", "openood")]["bank"]
  assert states[("relation", "ninco")]["bank"].dtype == np.float64     # the cut-off in float64


@pytest.mark.parametrize("group", [None, "label", "correct"])
def test_scatter_on_the_host_equals_the_jitted_scatter(group, monkeypatch):
  """On the CPU backend a chunk's scatter matrix is numpy's x.T @ x of the jitted masked rows
  (stats._chunk_sums); it equals the jitted product (stats.gram, the other backends' path) and a
  float64 numpy reference to rounding, and the other sums are the jitted chunk's."""
  import jax
  import jax.numpy as jnp

  from fi_jax.detectors import stats
  rng = np.random.default_rng(5)
  h = (rng.standard_normal((300, 40)) + 2.0).astype(np.float32)
  z = rng.standard_normal((300, 7)).astype(np.float32)
  y = rng.integers(-1, 7, 300)
  y[:20] = z[:20].argmax(1)                                       # some correct rows
  shift = jnp.asarray(h[:50].mean(0), jnp.float64)
  kw = dict(num_classes=7, group=group)
  host = stats._chunk_sums(h, z, y, shift, scatter=True, **kw)
  jitted = stats._moments_chunk(h, z, y, shift, scatter=True, **kw)
  assert jax.default_backend() == "cpu" and isinstance(host["scatter"], np.ndarray)
  m = np.ones(300, bool) if group is None else (
      (y >= 0) if group == "label" else (y >= 0) & (y == z.argmax(1)))
  x = (h.astype(np.float64) - np.asarray(shift))[m]
  for got in (host["scatter"], np.asarray(jitted["scatter"])):
    np.testing.assert_allclose(got, x.T @ x, rtol=1e-12, atol=1e-9)
  for key in jitted:
    if key != "scatter":
      np.testing.assert_array_equal(np.asarray(host[key]), np.asarray(jitted[key]), err_msg=key)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")    # the jitted path elsewhere
  np.testing.assert_array_equal(np.asarray(stats._chunk_sums(h, z, y, shift, scatter=True,
                                                             **kw)["scatter"]),
                                np.asarray(jitted["scatter"]))
