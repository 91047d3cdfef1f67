"""Third-wave post-hoc detectors (ora, cfood, grood) vs independent numpy references of the
papers' official code (tests/helpers/detector_reference.py: ref_ora from
berkerdemirel/ORA-OOD-Detection-with-Relative-Angles @ 58d0733283c73a291d254696d6a4084b84a78f97
util/ood_methods.py; ref_cfood from OpenOOD openood/postprocessors/cfood_postprocessor.py @
a3eb335eb23bf944224f2f635983f31c3fac281d; ref_grood from OpenOOD openood/postprocessors/grood.py
@ 539b8054d66345401a9a21bc4f565722ce36f485). Every score must equal its reference within 1e-5
relative on ReLU-like and signed features and beat MSP on a case built so that MSP is at chance.
Streaming fits, state files and the shared scope run for every registered detector in
test_references.py."""
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fi_jax import detectors
from fi_jax.detectors import knn as knn_lib
from fi_jax.detectors import stats
from tests.helpers.detector_reference import (
  assert_scores,
  fit_score,
  make_data,
  ref_cfood,
  ref_grood,
  ref_ora,
)

RTOL = 1e-5


@pytest.fixture(scope="module", params=[False, True], ids=["relu", "signed"])
def data(request):
  return make_data(request.param)


def test_ora_equals_reference(data):
  fit, test, head = data
  assert_scores(fit_score("ora", fit, test, head), ref_ora(fit, test, head), rtol=RTOL)


def test_ora_undefined_angles_count_as_zero(data):
  """Classes whose weights equal the predicted class's (0/0 angles) count as 0, as the official
  NaN -> 0: with some columns tied the scores are the reference's, with all of them tied 0."""
  fit, test, head = data
  w = np.array(head.w, copy=True)
  w[:, 1:4] = w[:, :1]                                        # classes 0-3 share a weight
  tied = detectors.Outputs(test.features, np.asarray(test.features) @ w + np.asarray(head.b))
  part = type(head)(w, head.b)
  assert_scores(fit_score("ora", fit, tied, part), ref_ora(fit, tied, part), rtol=RTOL)
  same = type(head)(np.repeat(w[:, :1], w.shape[1], axis=1), head.b)
  flat = detectors.Outputs(test.features, np.asarray(test.features) @ same.w + np.asarray(head.b))
  np.testing.assert_array_equal(np.asarray(fit_score("ora", fit, flat, same)), 0.0)


def test_cfood_equals_reference(data):
  """alpha = 0.5: the reference takes the same seeded rows (a hash of the row index)."""
  fit, test, head = data
  alpha, k = 0.5, 0.05
  keep = stats.bernoulli_mask(0, 0, len(fit.labels), alpha)
  assert_scores(fit_score("cfood", fit, test, head, alpha=alpha, k=k),
                ref_cfood(np.asarray(fit.features)[keep], test.features, k), rtol=RTOL)


def test_grood_equals_reference(data):
  """On the signed features with small query / bank blocks (the last bank block clamped and
  masked)."""
  fit, test, head = data
  signed = bool((np.asarray(fit.features) < 0).any())
  blocks = {"query_block": 7, "bank_block": 5} if signed else {}
  assert_scores(fit_score("grood", fit, test, head, **blocks), ref_grood(fit, test), rtol=RTOL)


def test_cfood_fit_order_statistics_on_cpu_and_accelerator(monkeypatch):
  """The fit's order statistics: on the CPU numpy's distances (the same expression) sorted by
  np.sort, bit for bit; on an accelerator XLA's distances sorted by jnp.sort, equal to float64
  rounding (the products' last bits differ, as XLA's do between block shapes)."""
  import jax.numpy as jnp
  fit, _, _ = make_data(True, seed=3)
  ref = fit.features[:200].astype(np.float64)
  ref /= np.linalg.norm(ref, axis=1, keepdims=True) + 1e-10
  positions = np.array([0, 3, 17, 101, 198])
  sq = np.sum(ref * ref, -1)
  want = np.sort(sq[:, None] + sq[None, :] - 2.0 * (ref @ ref.T), axis=1)[:, positions + 1].T
  host = knn_lib._cfood_self_knn(jnp.asarray(ref), positions)
  np.testing.assert_array_equal(host, want)
  monkeypatch.setattr(knn_lib.jax, "default_backend", lambda: "gpu")
  device = knn_lib._cfood_self_knn(jnp.asarray(ref), positions)
  np.testing.assert_allclose(device, want, rtol=1e-12, atol=1e-14)


def _levels_reference(d, rho, need):
  """The smallest j with #{i: rho[j, i] >= d[q, i]} >= need per query row q (nk if none)."""
  counts = (rho[None, :, :] >= d[:, None, :]).sum(-1)                  # [Q, nk]
  ok = counts >= need
  return np.where(ok.any(1), ok.argmax(1), rho.shape[0])


@pytest.mark.parametrize("caps", [None, (1, 2)], ids=["gathered", "dense-fallback"])
def test_cfood_float32_screen_makes_the_float64_decisions(caps, monkeypatch):
  """cfood_levels under x64 decides on float32 distances within `cfood_band` and recomputes the
  undecided pairs in float64: its levels are the float64 ones on a bank built so that many
  pairs sit 1e-9 from a rho (inside the band, far above float64's rounding), whether those
  pairs are gathered or (over the caps) their blocks recomputed densely."""
  import jax.numpy as jnp
  if caps is not None:
    monkeypatch.setattr(knn_lib, "_CFOOD_FIX_CAPS", caps)
  rng = np.random.default_rng(11)
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  ref, v = unit(rng.standard_normal((300, 32))), unit(rng.standard_normal((96, 32)))
  d = (v * v).sum(1)[:, None] + (ref * ref).sum(1)[None, :] - 2.0 * v @ ref.T
  # rho[j, i]: the (3 j + 10)-th smallest distance of column i over the queries, +/- 1e-9
  rho = np.sort(d, axis=0)[3 * np.arange(20) + 10] + rng.choice([-1e-9, 1e-9], (20, 300))
  rho = np.maximum.accumulate(rho, axis=0)
  need = 40
  want = _levels_reference(d, rho, need)
  band = knn_lib.cfood_band(32)
  undecided = (np.abs(rho[None] - d[:, None]) < band).any(1)          # [Q, n]
  assert undecided.sum() > 2 and 0 < len(np.unique(want)) < 20
  got = knn_lib.cfood_levels(jnp.asarray(v), jnp.asarray(ref), jnp.asarray((ref * ref).sum(1)),
                             jnp.asarray(rho), jnp.asarray(need, jnp.int32),
                             query_block=32 if caps is None else 48)
  np.testing.assert_array_equal(np.asarray(got), want)


def test_cfood_count_threshold_is_the_official_float32_test():
  """The official `count.float() / float(n) >= k` in torch float32, for every count."""
  for n, k in ((7, 0.01), (600, 0.01), (1000, 0.3), (12345, 0.001), (30, 1.0)):
    frac = torch.arange(n + 1).float() / float(n)
    want = int(torch.nonzero(frac >= k)[0, 0])
    assert knn_lib.cfood_count_threshold(n, k) == want, (n, k)


def _auroc(name, fit, test, ood, head, **hp):
  det = detectors.build(name, **hp)
  state = det.fit(fit, head)
  s_id, s_ood = np.asarray(det.score(state, test)), np.asarray(det.score(state, ood))
  return roc_auc_score(np.r_[np.ones(len(s_id)), np.zeros(len(s_ood))], np.r_[s_id, s_ood])


@pytest.mark.parametrize("name,floor", [("ora", 0.7), ("cfood", 0.8), ("grood", 0.95)])
def test_beats_msp_when_only_features_differ(name, floor):
  """OOD features are isotropic noise of the ID rows' norms carrying the ID rows' own logits:
  MSP is at chance, the feature signal (angles to the boundaries, neighbourhoods, gradients to
  the noise prototype) is all there is."""
  fit, test, head = make_data(True, seed=5)
  rng = np.random.default_rng(1)
  ood = rng.normal(size=test.features.shape)
  ood *= (np.linalg.norm(test.features, axis=1) / np.linalg.norm(ood, axis=1))[:, None]
  ood = detectors.Outputs(ood.astype(np.float32), test.logits)
  assert abs(_auroc("msp", fit, test, ood, head) - 0.5) < 1e-9
  assert _auroc(name, fit, test, ood, head) > floor     # measured: ora 0.78, cfood 0.88, grood 1.0


def test_presets_and_validation():
  for name, want in (("ora", {}), ("cfood", {"alpha": 0.1, "k": 0.01, "seed": 0}),
                     ("grood", {})):
    for preset in (None, *detectors.PRESETS):
      hp = detectors.hparams_of(name, preset)
      assert {k: hp[k] for k in want} == want
  for name, bad, match in (("cfood", {"alpha": 0.0}, "alpha"), ("cfood", {"alpha": 1.5}, "alpha"),
                           ("cfood", {"k": 0.0}, "k="), ("cfood", {"seed": 0.5}, "seed"),
                           ("cfood", {"query_block": 0}, "query_block"),
                           ("grood", {"bank_block": 0}, "bank_block")):
    with pytest.raises(ValueError, match=match):
      detectors.build(name, **bad)
  fit, test, head = make_data(False)
  few = detectors.Outputs(fit.features[:3], fit.logits[:3], fit.labels[:3])
  with pytest.raises(ValueError, match="at least 2"):
    detectors.build("cfood").fit(few, head)                    # 10% of 3 rows
  wrong = detectors.Outputs(fit.features, fit.logits, (np.asarray(fit.logits).argmax(1) + 1)
                            .astype(np.int32) % 11)
  with pytest.raises(ValueError, match="no fit row is classified correctly"):
    detectors.build("grood").fit(wrong, head)
  with pytest.raises(ValueError, match="head"):
    detectors.build("ora").fit(fit)
