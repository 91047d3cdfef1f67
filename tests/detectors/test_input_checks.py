"""Issue 13, detector and metric side: nothing silent, nothing lost.

Non-finite scores fail one detector with a named reason (the others are still scored); 0/0 in a
detector's formula gives its documented finite value; non-finite fit rows are an error naming
the detector and the count (or dropped on request); fit/score inputs and hyper-parameter
values are validated with named errors; metrics handle any group id and seed with x64 off and
compute the per-group pass once per row.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax import detectors, pipeline
from fi_jax.detectors import core
from fi_jax.metrics import device as metrics

C, D, N_FIT, N_TEST = 6, 16, 200, 60


def make_data(seed=0, c=C, d=D):
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=(c, d)) * 2.0
  y = rng.integers(0, c, N_FIT + N_TEST)
  h = np.abs(mu[y] + rng.normal(size=(N_FIT + N_TEST, d))).astype(np.float32)
  w = (rng.normal(size=(d, c)) * 0.4).astype(np.float32)
  b = (rng.normal(size=c) * 0.2).astype(np.float32)
  z = (h.astype(np.float64) @ w + b).astype(np.float32)
  y = y.astype(np.int64)
  return (detectors.Outputs(h[:N_FIT], z[:N_FIT], y[:N_FIT]),
          detectors.Outputs(h[N_FIT:], z[N_FIT:], y[N_FIT:]), detectors.Head(w, b))


SMALL = {"vim": {"dim": 8}, "residual": {"dim": 8}, "knn": {"k": 5},
         "nnguide": {"k": 5, "alpha": 0.5}}
FIT_FEATURES = ["react", "mds", "rmds", "residual", "vim", "nnguide", "fdbd", "nci", "cosine",
                "relative_cosine", "dice", "knn", "she"]
FIT_LOGITS = ["tempscale", "klm", "vim", "nnguide", "she"]


def build(name, **hp):
  return detectors.build(name, **{**SMALL.get(name, {}), **hp})


def with_row(out, field, row, value):
  x = np.array(getattr(out, field))
  x[row] = value
  return detectors.Outputs(**{**vars(out), field: x})


def rows(out, keep):
  return detectors.Outputs(out.features[keep], out.logits[keep], out.labels[keep])


# ----------------------------------------------------------------------------- defect 1

def sets_of(fit, test, ood):
  arrays = lambda o, lab: {"features": np.asarray(o.features), "logits": np.asarray(o.logits),
                           "label": lab}
  return {"id_fit": arrays(fit, fit.labels), "id_test": arrays(test, test.labels),
          "ood/x": {**arrays(ood, np.full(len(ood.logits), -1)),
                    "group": np.arange(len(ood.logits)) % 3}}


@pytest.mark.slow
def test_nonfinite_scores_fail_only_that_detector():
  fit, test, head = make_data()
  _, ood, _ = make_data(seed=1)
  ood = with_row(with_row(ood, "logits", 3, np.inf), "logits", 7, np.nan)
  sets = sets_of(fit, test, ood)
  dets = detectors.build_suite(["maxlogit", "knn", "mds"], hparams={"knn": {"k": 5}})
  scores, errors = pipeline.score_sets(dets, sets, head, keep_going=True)
  assert sorted(scores) == ["knn", "mds"] and list(errors) == ["maxlogit"]
  assert "maxlogit" in errors["maxlogit"] and "2 of 60 on 'ood/x'" in errors["maxlogit"]
  rows_ = pipeline.metric_rows(scores, sets)
  assert sorted(r["detector"] for r in rows_) == ["knn", "mds"]
  # the evaluator's mode (keep_going=False) still raises, naming detector and set
  with pytest.raises(ValueError, match=r"maxlogit: non-finite scores.*2 of 60 on 'ood/x'"):
    pipeline.score_sets(dets, sets, head)


def test_metrics_error_names_what_failed():
  x, y = np.r_[np.arange(10.0), np.nan], np.arange(5.0)
  with pytest.raises(ValueError, match=r"^fdbd on ood/x: id_scores has 1 of 11 NaN"):
    metrics.ood_metrics(x, y, name="fdbd on ood/x")
  with pytest.raises(ValueError, match=r"^ood_scores has 1 of 11 NaN"):
    metrics.ood_metrics(y, x)


# ----------------------------------------------------------------------------- 0/0 values

def test_zero_head_and_constant_features_give_documented_finite_scores():
  fit, test, _ = make_data()
  zero = detectors.Head(np.zeros((D, C), np.float32), np.zeros(C, np.float32))
  zfit = detectors.Outputs(fit.features, np.zeros_like(fit.logits), fit.labels)
  ztest = detectors.Outputs(test.features, np.zeros_like(test.logits), test.labels)
  # fdbd: identical weight vectors have no boundary -> every term 0
  s = np.asarray(build("fdbd").score(build("fdbd").fit(zfit, zero), ztest))
  np.testing.assert_array_equal(s, 0.0)
  # constant features: h = mu for every row -> fdbd 0, nci alpha |h|_1
  h0 = np.broadcast_to(fit.features[:1], fit.features.shape).copy()
  cfit = detectors.Outputs(h0, fit.logits, fit.labels)
  ctest = detectors.Outputs(h0[:N_TEST], test.logits, test.labels)
  _, _, head = make_data()
  s = np.asarray(build("fdbd").score(build("fdbd").fit(cfit, head), ctest))
  np.testing.assert_array_equal(s, 0.0)
  s = np.asarray(build("nci").score(build("nci").fit(cfit, head), ctest))
  np.testing.assert_allclose(s, 1e-4 * np.abs(h0[0].astype(np.float64)).sum(), rtol=1e-12)
  # ash_s / scale on all-zero features: s1 / s2 = 0 / 0 -> 1
  zf = detectors.Outputs(np.zeros_like(test.features), test.logits)
  for name in ("ash_s", "scale"):
    det = build(name)
    s = np.asarray(det.score(det.fit(fit, head), zf))
    np.testing.assert_allclose(s, np.log(np.exp(head.b.astype(np.float64)).sum()), rtol=1e-6)
  # vim: every fit residual 0 (zero head, zero features) -> alpha = 0: the energy
  z0 = detectors.Outputs(np.zeros_like(fit.features), np.zeros_like(fit.logits))
  state = build("vim").fit(z0, zero)
  assert float(state["alpha"]) == 0.0
  s = np.asarray(build("vim").score(state, test))
  assert np.isfinite(s).all()


# ----------------------------------------------------------------------------- defect 3

@pytest.mark.parametrize("name", FIT_FEATURES)
def test_nan_fit_feature_row_is_named_error_or_dropped(name):
  fit, test, head = make_data()
  bad = with_row(fit, "features", 17, np.nan)
  with pytest.raises(ValueError, match=rf"^{name}: 1 of {N_FIT} fit rows .*NaN or inf.*row 17"):
    build(name).fit(bad, head)
  keep = np.arange(N_FIT) != 17
  det = build(name)
  want = np.asarray(det.score(det.fit(rows(fit, keep), head), test))
  got = np.asarray(det.score(det.fit(bad, head, nonfinite="drop"), test))
  np.testing.assert_array_equal(got, want)
  assert np.isfinite(got).all()


@pytest.mark.parametrize("name", FIT_LOGITS)
def test_inf_fit_logit_row_is_named_error(name):
  fit, _, head = make_data()
  with pytest.raises(ValueError, match=rf"^{name}: 1 of {N_FIT} fit rows .*Outputs.logits"):
    build(name).fit(with_row(fit, "logits", 3, np.inf), head)


def test_nan_in_fit_logits_does_not_concern_feature_only_detectors():
  fit, test, head = make_data()
  det = build("knn")
  np.testing.assert_array_equal(
      np.asarray(det.score(det.fit(with_row(fit, "logits", 3, np.nan), head), test)),
      np.asarray(det.score(det.fit(fit, head), test)))


def test_streaming_fit_checks_every_batch():
  fit, test, head = make_data()
  bad = with_row(fit, "features", 150, np.nan)
  batches = lambda o: [rows(o, slice(i, i + 64)) for i in range(0, N_FIT, 64)]
  for make in (lambda: batches(bad), lambda: iter(batches(bad))):
    with pytest.raises(ValueError, match=r"^mds: 1 of 64 fit rows \(rows 128\.\.191.*row 150"):
      build("mds").fit(make(), head)
  keep = np.arange(N_FIT) != 150
  det = build("vim")
  want = np.asarray(det.score(det.fit(rows(fit, keep), head), test))
  for data in (batches(bad), iter(batches(bad))):
    got = np.asarray(det.score(det.fit(data, head, nonfinite="drop"), test))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_nonfinite_option_is_validated():
  fit, _, head = make_data()
  with pytest.raises(ValueError, match="nonfinite must be one of"):
    build("mds").fit(fit, head, nonfinite="ignore")


def test_pipeline_passes_nonfinite_to_fit():
  fit, test, head = make_data()
  _, ood, _ = make_data(seed=1)
  sets = sets_of(with_row(fit, "features", 5, np.nan), test, ood)
  dets = detectors.build_suite(["mds"])
  _, errors = pipeline.score_sets(dets, sets, head, keep_going=True)
  assert "mds: 1 of 200 fit rows" in errors["mds"]
  scores, errors = pipeline.score_sets(dets, sets, head, keep_going=True, nonfinite="drop")
  assert not errors and np.isfinite(scores["mds"]["ood/x"]).all()


# ----------------------------------------------------------------------------- defect 4

def test_label_range_and_dtype():
  fit, _, head = make_data()
  one_based = detectors.Outputs(fit.features, fit.logits, fit.labels + 1)
  with pytest.raises(ValueError, match=r"mds: Outputs.labels must be in \[0, 6\) or -1.*"
                                       r"\[1, 6\] \(1-based labels"):
    build("mds").fit(one_based, head)
  neg = with_row(fit, "labels", 4, -2)
  with pytest.raises(ValueError, match=r"cosine: Outputs.labels .*got values in \[-2, 5\]"):
    build("cosine").fit(neg, head)
  as_float = detectors.Outputs(fit.features, fit.logits, fit.labels.astype(np.float32))
  with pytest.raises(ValueError, match="tempscale: Outputs.labels must be integers.*float32"):
    build("tempscale").fit(as_float, head)
  # -1 (unknown) is fine
  build("mds").fit(with_row(fit, "labels", 4, -1), head)


def test_wrong_length_labels():
  fit, _, head = make_data()
  short = detectors.Outputs(fit.features, fit.logits, fit.labels[:-3])
  with pytest.raises(ValueError, match=r"tempscale: fit Outputs.labels has 197 rows but "
                                       r"Outputs.logits has 200"):
    build("tempscale").fit(short, head)


def test_shape_mismatches_name_detector_argument_and_shapes():
  fit, test, head = make_data()
  # nci: logits with another C than the head, at score time
  det = build("nci")
  state = det.fit(fit, head)
  wide = detectors.Outputs(test.features, np.zeros((N_TEST, C + 2), np.float32))
  with pytest.raises(ValueError, match=r"nci: Outputs.logits has shape \(60, 8\) .*fitted for 6"):
    det.score(state, wide)
  # knn: features of another dimension than the fit features
  det = build("knn")
  state = det.fit(fit, head)
  other = detectors.Outputs(np.ones((N_TEST, D + 3), np.float32), test.logits)
  with pytest.raises(ValueError, match=r"knn: Outputs.features has shape \(60, 19\) .*fitted "
                                       r"for 16"):
    det.score(state, other)
  # the head's D against the fit features
  big = detectors.Head(np.zeros((D + 1, C), np.float32), np.zeros(C, np.float32))
  with pytest.raises(ValueError, match=r"react: fit Outputs.features has shape \(200, 16\) but "
                                       r"Head.w has shape \(17, 6\)"):
    build("react").fit(fit, big)
  # the head's C against the fit logits
  few = detectors.Head(np.zeros((D, C - 1), np.float32), np.zeros(C - 1, np.float32))
  with pytest.raises(ValueError, match=r"vim: fit Outputs.logits has shape \(200, 6\) but "
                                       r"Head.w has shape \(16, 5\)"):
    build("vim").fit(fit, few)


def test_score_checks_keep_scores_identical_and_state_round_trips(tmp_path):
  fit, test, head = make_data()
  det = build("mds")
  state = det.fit(fit, head)
  assert state[core.DIMS_KEY].tolist() == [D, C]
  path = str(tmp_path / "s.npz")
  detectors.save_state(path, state)
  np.testing.assert_array_equal(np.asarray(det.score(detectors.load_state(path), test)),
                                np.asarray(det.score(state, test)))
  legacy = {k: v for k, v in state.items() if k != core.DIMS_KEY}   # a state without it
  np.testing.assert_array_equal(np.asarray(det.score(legacy, test)),
                                np.asarray(det.score(state, test)))


# ----------------------------------------------------------------------------- hyper-parameters

@pytest.mark.parametrize("name,key,value,valid", [
    ("react", "percentile", 0.0, r"a finite number in \(0, 100\)"),
    ("dice", "percentile", 100.0, r"a finite number in \(0, 100\)"),
    ("ash_b", "percentile", float("nan"), r"a finite number in \(0, 100\)"),
    ("residual", "dim", 0, r"None or an integer >= 1"),
    ("vim", "max_rows", 2.5, r"an integer >= 1"),
    ("nci", "alpha", -1.0, r"a finite number >= 0"),
    ("tempscale", "t_max", float("inf"), r"a finite number > 0.01"),
    ("gen", "top_m", 2.5, r"an integer >= 1"),
    ("energy", "temperature", True, r"a finite number > 0"),
    ("knn", "query_block", 0.5, r"an integer >= 1"),
    ("nnguide", "alpha", 1.5, r"a finite number in \(0, 1\]"),
    ("she", "metric", "l2", r"'inner_product' or 'euclidean' or 'cosine'"),
    ("fdbd", "distance_as_normalizer", 1, r"True or False"),
    ("react", "seed", 0.5, r"an integer"),
])
def test_hyper_parameter_ranges(name, key, value, valid):
  with pytest.raises(ValueError, match=rf"^{name}: hyper-parameter {key}=.* valid: {valid}"):
    detectors.build(name, **{key: value})


# ----------------------------------------------------------------------------- defect 9

def scores_and_groups(seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(1, 1, 300), rng.normal(0, 1, 200), rng.integers(0, 5, 200)


def test_group_ids_beyond_int32_with_x64_off():
  x, y, g = scores_and_groups()
  big = g.astype(np.int64) * (1 << 33) + (1 << 31) + 7
  with jax.enable_x64(False):
    want = metrics.ood_metrics(x, y, ood_groups=g)
    assert metrics.ood_metrics(x, y, ood_groups=big) == want
    t_small = metrics.per_group_metrics(x, y, g)
    t_big = metrics.per_group_metrics(x, y, big)
  np.testing.assert_array_equal(t_big["group"], np.unique(big))
  for k in t_small:
    if k != "group":
      np.testing.assert_array_equal(t_big[k], t_small[k])


@pytest.mark.slow
def test_large_seed_with_x64_on_and_off():
  x, y, _ = scores_and_groups()
  for x64, seed in ((False, 2 ** 40), (False, 2 ** 31), (True, 2 ** 70)):
    with jax.enable_x64(x64):
      a = metrics.ood_metrics(x, y, n_bootstrap=8, seed=seed)
      assert a == metrics.ood_metrics(x, y, n_bootstrap=8, seed=seed)
      assert a != metrics.ood_metrics(x, y, n_bootstrap=8, seed=seed + 1)
      i, o = metrics.bootstrap_indices(len(x), len(y), 8, seed=seed)
      assert i.shape == (8, 300) and o.shape == (8, 200)


@pytest.mark.slow
@pytest.mark.parametrize("n_bootstrap", [0, 7])
def test_metric_rows_one_pass_per_row_bit_identical(monkeypatch, n_bootstrap):
  x, y, g = scores_and_groups()
  scores = {"det": {"id_test": x, "ood/a": y}}
  sets = {"ood/a": {"group": g}}
  calls = []
  real = metrics._run
  monkeypatch.setattr(metrics, "_run", lambda *a, **k: calls.append(1) or real(*a, **k))
  (row,) = pipeline.metric_rows(scores, sets, per_group=True, n_bootstrap=n_bootstrap, seed=3)
  assert len(calls) == 1
  want = metrics.ood_metrics(jnp.asarray(x), jnp.asarray(y), ood_groups=jnp.asarray(g),
                             n_bootstrap=n_bootstrap, seed=3)
  table = metrics.per_group_metrics(jnp.asarray(x), jnp.asarray(y), jnp.asarray(g))
  assert {k: row[k] for k in want} == want
  assert row["per_class"].keys() == table.keys()
  for k in table:
    np.testing.assert_array_equal(row["per_class"][k], table[k], err_msg=k)
