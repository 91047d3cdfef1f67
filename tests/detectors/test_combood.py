"""CombOOD vs an independent numpy / scipy / scikit-learn reference of the authors' code
(rmagesh148/combood at 7457e1f7f6a304775506cd490fd4f353af11161b: confidenciator.py
`fit_knn_faiss` / `predict_knn_faiss` / the Mahalanobis of `Confidenciator.__init__` and
`predict_mahala`; test_ood.py `square_log_probability`), on the penultimate-feature variant
fi_jax implements (docs/detectors.md#combood)."""
import numpy as np
import pytest
import scipy.spatial.distance as spd
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from fi_jax import detectors
from fi_jax.detectors import knn as knn_lib
from tests.helpers.detector_reference import C, assert_scores, f64, fit_score, make_data

RTOL = 1e-6


def ref_combood(fit, test, k=50, reg=1.0):
  """-sqrt(D) log(K-th smallest squared L2 distance between unit features) - Mahalanobis^2 of
  the standardised unit features under N(0, cov(z) + reg I) (the code's normalizer adds 1e-10
  to every unit-feature component: a constant shift, which both distances ignore)."""
  nrm = lambda x: f64(x) / np.linalg.norm(f64(x), axis=1, keepdims=True)
  hf, ht = nrm(fit.features), nrm(test.features)
  d2 = np.sort(spd.cdist(ht, hf, "sqeuclidean"), axis=1)[:, k - 1]
  scaler = StandardScaler().fit(hf)
  zf, zt = scaler.transform(hf), scaler.transform(ht)
  inv = np.linalg.inv(np.cov(zf, rowvar=False) + reg * np.identity(hf.shape[1]))
  maha = np.array([spd.mahalanobis(row, np.zeros(hf.shape[1]), inv) for row in zt])
  return -np.sqrt(hf.shape[1]) * np.log(d2) - maha ** 2


@pytest.fixture(scope="module", params=[False, True], ids=["nonneg", "signed"])
def data(request):
  return make_data(request.param)


@pytest.mark.parametrize("hp", [{}, {"k": 5, "reg": 0.25}])
def test_combood_equals_reference(data, hp):
  fit, test, head = data
  assert_scores(fit_score("combood", fit, test, head, **hp), ref_combood(fit, test, **hp),
                rtol=RTOL)


@pytest.mark.slow
def test_combood_streaming_fit_and_blocks():
  """Fitting from batches (and scoring with small query / bank blocks) gives the same scores."""
  fit, test, head = make_data(True, seed=4)
  det = detectors.build("combood", k=7)
  whole = np.asarray(det.score(det.fit(fit, head), test))
  batches = [detectors.Outputs(fit.features[i:i + 97], fit.logits[i:i + 97], fit.labels[i:i + 97])
             for i in range(0, len(fit.labels), 97)]
  det2 = detectors.build("combood", k=7, query_block=16, bank_block=64)
  np.testing.assert_allclose(np.asarray(det2.score(det2.fit(iter(batches), head), test)), whole,
                             rtol=1e-12)


def _auroc(name, fit, test, ood, head):
  det = detectors.build(name)
  st = det.fit(fit, head)
  s_id, s_ood = np.asarray(det.score(st, test)), np.asarray(det.score(st, ood))
  return roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])


def test_combood_beats_msp_on_confident_novel_features():
  """OOD features lie off the ID clusters (new random directions) but carry a strong push along
  one class's weight vector, so the classifier is confident on them: MSP ranks them as ID, the
  distances to the fit features do not."""
  fit, test, head = make_data(False, seed=5)
  rng = np.random.default_rng(1)
  w = np.asarray(head.w, np.float64)
  n, d = len(test.labels), w.shape[0]
  h = np.abs(rng.normal(size=(n, d))) * 2.0
  cls = rng.integers(0, C - 1, n)
  h += 12.0 * np.maximum(w[:, cls].T, 0.0)
  z = h @ w + np.asarray(head.b, np.float64)
  ood = detectors.Outputs(h.astype(np.float32), z.astype(np.float32))
  a_msp, a_comb = _auroc("msp", fit, test, ood, head), _auroc("combood", fit, test, ood, head)
  assert a_msp < 0.1 and a_comb > 0.95, (a_msp, a_comb)          # measured 0.0001, 0.99


def test_presets_and_validation():
  hp = detectors.hparams_of("combood", "openood")
  assert (hp["k"], hp["reg"]) == (50, 1.0)
  assert detectors.hparams_of("combood", None) == detectors.hparams_of("combood", "ninco") == hp
  for bad, match in (({"k": 0}, "k"), ({"reg": 0.0}, "reg"), ({"reg": float("inf")}, "reg"),
                     ({"k": 2.5}, "k")):
    with pytest.raises(ValueError, match=match):
      detectors.build("combood", **bad)
  fit, test, head = make_data(False)
  one = detectors.Outputs(fit.features[:1], fit.logits[:1], fit.labels[:1])
  with pytest.raises(ValueError, match="at least 2 rows"):
    detectors.build("combood").fit(one, head)


@pytest.mark.slow
def test_shared_scope_reuses_knn_search_and_bank(monkeypatch):
  """Inside detectors.shared() CombOOD scores exactly as alone, uses knn's bank, and one
  neighbour search per query set serves knn (k=50, 1000) and CombOOD (k=50)."""
  fit, test, head = make_data(True, seed=3)
  runs = [(n, p) for n in ("knn", "combood") for p in detectors.PRESETS]
  alone = {r: fit_score(r[0], fit, test, head, preset=r[1]) for r in runs}
  calls = {"n": 0}
  real = knn_lib.knn_order_stats

  def counted(*a, **kw):
    calls["n"] += 1
    return real(*a, **kw)
  monkeypatch.setattr(knn_lib, "knn_order_stats", counted)
  dets = {r: detectors.build(r[0], preset=r[1]) for r in runs}
  with detectors.shared(dets.values()):
    states = {r: d.fit(fit, head) for r, d in dets.items()}
    together = {r: np.asarray(d.score(states[r], test)) for r, d in dets.items()}
  for r in runs:
    np.testing.assert_array_equal(together[r], alone[r], err_msg=str(r))
  assert calls["n"] == 1
  assert states[("combood", "openood")]["bank"] is states[("knn", "openood")]["bank"]
  # knn's search (run first) also computes an announced combood k it does not need itself
  pair = [detectors.build("knn", k=50), detectors.build("combood", k=7)]
  with detectors.shared(pair):
    got = [np.asarray(d.score(d.fit(fit, head), test)) for d in pair]
  assert calls["n"] == 2
  np.testing.assert_array_equal(got[1], fit_score("combood", fit, test, head, k=7))
