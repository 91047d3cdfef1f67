"""fi_jax.detectors vs independent numpy / scikit-learn / torch references of the spec formulas.

Synthetic class-clustered features (non-negative and signed), a linear head, one class with no
fit rows and never predicted (empty-class and never-predicted pitfalls). Scores must match to
relative error <= 1e-4 and give the same ranking where the reference has no near-ties.
"""
import decimal
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.special
import scipy.stats

from fi_jax import detectors
from fi_jax.detectors import knn as knn_lib
from fi_jax.detectors import stats
from tests.helpers import subprocess_env
from tests.helpers.detector_reference import (
  EMPTY,
  N_FIT,
  C,
  D,
  assert_scores,
  energy_np,
  f64,
  fit_score,
  make_data,
  ref_ash,
  ref_class_means,
  ref_knn,
  ref_mds,
  ref_rmds,
  ref_vim_parts,
  softmax,
)


@pytest.fixture(scope="module", params=[False, True], ids=["nonneg", "signed"])
def data(request):
  return make_data(request.param)


@pytest.fixture(scope="module")
def nonneg():
  return make_data(False)


# ----------------------------------------------------------------------------- references


# ----------------------------------------------------------------------------- logit family

def test_msp_maxlogit_energy(nonneg):
  fit, test, head = nonneg
  z = f64(test.logits)
  assert_scores(fit_score("msp", fit, test, head), np.log(softmax(z).max(1)))
  assert_scores(fit_score("maxlogit", fit, test, head), z.max(1))
  assert_scores(fit_score("energy", fit, test, head), scipy.special.logsumexp(z, axis=1))
  assert_scores(fit_score("energy", fit, test, head, temperature=2.0),
                2.0 * scipy.special.logsumexp(z / 2.0, axis=1))


def test_msp_saturated_keeps_order():
  """float32 softmax saturates at 1.0; the float64 log path keeps every order
  (docs/detectors.md#pitfalls)."""
  gaps = np.linspace(20.0, 60.0, 41)
  z = np.zeros((len(gaps), 5), np.float32)
  z[:, 0] = gaps
  z[:, 1] = 1.0
  assert (jax.nn.softmax(jnp.asarray(z), axis=-1).max(-1) == 1.0).sum() > 20   # float32 ties
  out = detectors.Outputs(None, z)
  got = np.asarray(detectors.build("msp").score({}, out))
  decimal.getcontext().prec = 60
  ref = []
  for row in z.astype(np.float64):
    e = [decimal.Decimal(float(v)).exp() for v in row]
    ref.append(float((max(e) / sum(e)).ln()))
  np.testing.assert_allclose(got, ref, rtol=1e-9)
  assert (np.diff(got) > 0).all()                               # larger gap = more ID
  gen = np.asarray(detectors.build("gen").score({}, out))
  assert np.isfinite(gen).all() and (np.diff(gen) > 0).all()   # more confident = more ID


def test_tempscale(nonneg):
  fit, test, head = nonneg
  z, y = f64(fit.logits), np.asarray(fit.labels)

  def nll(t):
    return -np.mean(scipy.special.log_softmax(z / t, axis=1)[np.arange(len(y)), y])
  t_ref = scipy.optimize.minimize_scalar(nll, bounds=(0.01, 100.0), method="bounded",
                                         options={"xatol": 1e-10}).x
  det = detectors.build("tempscale")
  state = det.fit(fit, head)
  np.testing.assert_allclose(float(state["temperature"]), t_ref, rtol=1e-5)
  assert abs(float(state["temperature"]) - 1.0) > 1e-3        # a real fit, not the start
  ref = np.log(softmax(f64(test.logits) / t_ref).max(1))
  assert_scores(det.score(state, test), ref)


def test_gen(nonneg):
  fit, test, head = nonneg
  p = np.sort(softmax(f64(test.logits)), axis=1)[:, ::-1]
  for gamma, m in ((0.1, 100), (0.5, 5)):
    top = p[:, :min(m, C)]
    ref = -np.sum(top ** gamma * (1 - top) ** gamma, axis=1)
    assert_scores(fit_score("gen", fit, test, head, gamma=gamma, top_m=m), ref)


def ref_klm(fit, test, variant):
  pf, pt = softmax(f64(fit.logits)), softmax(f64(test.logits))
  pred = pf.argmax(1)
  templates = [pf[pred == k].mean(0) if (pred == k).any() else np.eye(C)[k] for k in range(C)]
  ref = []
  with np.errstate(divide="ignore", invalid="ignore"):
    for p in pt:
      if variant == "openood":
        kls = [scipy.stats.entropy(p, q) for q in templates]
      else:
        kls = [np.sum(np.where(p != 0, p * np.log(p / q), 0.0)) if (q[p != 0] > 0).all()
               else np.inf for q in templates]
      ref.append(-min(kls))
  return np.array(ref)


@pytest.mark.parametrize("variant", ["ninco", "openood"])
def test_klm(nonneg, variant):
  fit, test, head = nonneg
  assert EMPTY not in softmax(f64(fit.logits)).argmax(1)
  assert_scores(fit_score("klm", fit, test, head, variant=variant), ref_klm(fit, test, variant))


@pytest.mark.parametrize("variant", ["ninco", "openood"])
def test_klm_underflowed_softmax_meets_the_one_hot_template(nonneg, variant):
  """A row whose softmax underflows to exactly one-hot at the never-predicted class has KL 0 to
  that class's one-hot template (the score's maximum, 0), and rows with some p_i = 0 elsewhere
  keep the +inf of every template with a zero where they are positive."""
  fit, test, head = nonneg
  z = np.array(test.logits, np.float32, copy=True)
  z[0] = 0.0
  z[0, EMPTY] = 1000.0                                  # p = e_EMPTY exactly
  z[1, :C // 2] = -1000.0                               # half of p underflows to 0
  odd = detectors.Outputs(test.features, z)
  got = np.asarray(fit_score("klm", fit, odd, head, variant=variant))
  assert got[0] == 0.0
  assert_scores(got, ref_klm(fit, odd, variant))


def test_klm_never_predicted_template_is_one_hot(nonneg):
  fit, _, head = nonneg
  state = detectors.build("klm").fit(fit, head)
  assert bool(state["any_zero"])
  zero = np.asarray(state["zero"])
  assert zero[EMPTY].sum() == C - 1 and not zero[EMPTY, EMPTY]


# ----------------------------------------------------------------------------- feature shaping

def test_react(data):
  fit, test, head = data
  for preset, pct in ((None, 90.0), ("ninco", 99.0), ("openood", 90.0)):
    c = np.percentile(fit.features.reshape(-1), pct)
    ref = energy_np(np.minimum(test.features, c), head)
    assert_scores(fit_score("react", fit, test, head, preset=preset), ref)


@pytest.mark.parametrize("name,mode", [("ash_p", "p"), ("ash_b", "b"), ("ash_s", "s"),
                                       ("scale", "scale")])
def test_ash_scale(nonneg, name, mode):
  fit, test, head = nonneg
  for pct in (65.0, 90.0):
    ref = energy_np(ref_ash(test.features, pct, mode), head)
    assert_scores(fit_score(name, fit, test, head, percentile=pct), ref)


def test_ash_signed_features():
  """On signed features ASH-P/-B stay finite and equal the formula (docs/detectors.md#pitfalls)."""
  fit, test, head = make_data(True)
  for name, mode in (("ash_p", "p"), ("ash_b", "b")):
    ref = energy_np(ref_ash(test.features, 90.0, mode), head)
    assert_scores(fit_score(name, fit, test, head), ref)


def test_dice(data):
  fit, test, head = data
  m = f64(fit.features).mean(0)
  contrib = f64(head.w) * m[:, None]
  w = np.where(contrib > np.percentile(contrib, 90), f64(head.w), 0.0)
  ref = scipy.special.logsumexp(f64(test.features) @ w + f64(head.b), axis=1)
  assert_scores(fit_score("dice", fit, test, head), ref)


def test_gradnorm_equals_autograd(data):
  torch = pytest.importorskip("torch")
  fit, test, head = data
  w = torch.tensor(f64(head.w), requires_grad=True)
  ref = []
  for h in f64(test.features):
    logits = torch.tensor(h) @ w + torch.tensor(f64(head.b))
    loss = -torch.log_softmax(logits, 0).sum()
    (g,) = torch.autograd.grad(loss, w)
    ref.append(float(g.abs().sum()))
  assert_scores(fit_score("gradnorm", fit, test, head), ref)


# ----------------------------------------------------------------------------- distances

def test_mds_rmds(data):
  fit, test, head = data
  got = fit_score("mds", fit, test, head)
  assert_scores(got, ref_mds(fit, test))
  assert_scores(fit_score("rmds", fit, test, head), ref_rmds(fit, test))


def test_mds_without_head_and_singular_covariance():
  """D > N_fit: the covariance is singular and the pseudo-inverse is used
  (docs/detectors.md#mds)."""
  fit, test, head = make_data(False, seed=3, d=40)
  small = detectors.Outputs(fit.features[:30], fit.logits[:30], fit.labels[:30])
  det = detectors.build("mds")
  got = np.asarray(det.score(det.fit(small), test))
  assert_scores(got, ref_mds(small, test), rtol=1e-3)


@pytest.mark.parametrize("d,c,dim", [(D, C, 20), (8, C, 4)], ids=["D>C", "D<C"])
def test_vim_residual(d, c, dim):
  fit, test, head = make_data(False, seed=1, d=d, c=c)
  res, alpha = ref_vim_parts(fit, test, head, dim)
  assert_scores(fit_score("residual", fit, test, head, dim=dim), -res)
  ref = scipy.special.logsumexp(f64(test.logits), axis=1) - alpha * res
  assert_scores(fit_score("vim", fit, test, head, dim=dim), ref)


def test_vim_dim_rules():
  assert [detectors.distance.vim_dim(d) for d in (4096, 2048, 1024, 768, 512)] == [
      1000, 1000, 512, 512, 256]
  assert detectors.hparams_of("vim", "openood")["dim"] == 256
  assert detectors.hparams_of("residual", "openood")["dim"] == 512
  fit, _, head = make_data(False)
  with pytest.raises(ValueError, match="empty residual space"):
    detectors.build("vim", preset="openood").fit(fit, head)     # 256 >= D = 48


def test_cosine_relative_cosine_she(data):
  fit, test, head = data
  means = ref_class_means(fit)
  assert EMPTY not in means
  ht = f64(test.features)
  cos = np.stack([ht @ m / np.linalg.norm(ht, axis=1) / np.linalg.norm(m)
                  for m in means.values()], 1)
  assert_scores(fit_score("cosine", fit, test, head), cos.max(1))
  assert_scores(fit_score("relative_cosine", fit, test, head), np.log(softmax(cos).max(1)))
  # SHE: patterns from correctly classified fit rows; argmax over classes with a pattern
  hf, y, pred = f64(fit.features), np.asarray(fit.labels), f64(fit.logits).argmax(1)
  pats = {k: hf[(y == k) & (pred == k)].mean(0) for k in range(C) if ((y == k) & (pred == k)).any()}
  ks = np.array(sorted(pats))
  yhat = ks[f64(test.logits)[:, ks].argmax(1)]
  ref = np.array([ht[i] @ pats[k] for i, k in enumerate(yhat)])
  assert_scores(fit_score("she", fit, test, head), ref)
  ref_e = -np.array([np.linalg.norm(ht[i] - pats[k]) for i, k in enumerate(yhat)])
  assert_scores(fit_score("she", fit, test, head, metric="euclidean"), ref_e)


def test_empty_class_with_labels_never_nan():
  """A class with no fit rows (here: also never predicted) leaves no NaN in any state."""
  fit, test, head = make_data(False)
  for name in ("mds", "rmds", "she", "cosine", "relative_cosine", "klm"):
    det = detectors.build(name)
    state = det.fit(fit, head)
    for k, v in state.items():
      assert not np.isnan(np.asarray(v, np.float64)).any(), (name, k)
    assert np.isfinite(np.asarray(det.score(state, test))).all(), name


def test_fdbd_nci(data):
  fit, test, head = data
  w, z, ht = f64(head.w), f64(test.logits), f64(test.features)
  mu = f64(fit.features).mean(0)
  for dist_norm in (True, False):
    ref = []
    for i in range(len(z)):
      k = z[i].argmax()
      s = sum((z[i, k] - z[i, c]) / np.linalg.norm(w[:, k] - w[:, c]) for c in range(C) if c != k)
      ref.append(s / np.linalg.norm(ht[i] - mu if dist_norm else ht[i]))
    assert_scores(fit_score("fdbd", fit, test, head, distance_as_normalizer=dist_norm), ref)
  ref = [w[:, z[i].argmax()] @ (ht[i] - mu) / np.linalg.norm(ht[i] - mu)
         + 1e-2 * np.abs(ht[i]).sum() for i in range(len(z))]
  assert_scores(fit_score("nci", fit, test, head, alpha=1e-2), ref)


def test_mcm():
  fit, test, head = make_data(True)
  t = f64(head.w) * 50.0
  t = t / np.linalg.norm(t, axis=0, keepdims=True)
  f = f64(test.features) / np.linalg.norm(f64(test.features), axis=1, keepdims=True)
  for tau in (1.0, 0.1):
    ref = np.log(softmax(f @ t / tau).max(1))
    head50 = detectors.Head(np.asarray(head.w) * 50.0, np.zeros(C, np.float32))
    assert_scores(fit_score("mcm", fit, test, head50, temperature=tau), ref)


# ----------------------------------------------------------------------------- neighbours

@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 50])
def test_knn_brute_force(data, k):
  fit, test, head = data
  ref = ref_knn(fit, test, k)
  assert_scores(fit_score("knn", fit, test, head, k=k), ref)
  # several query and bank blocks, the last bank block clamped and masked
  assert_scores(fit_score("knn", fit, test, head, k=k, query_block=32, bank_block=70), ref)


def test_knn_clamps_k_to_bank(nonneg):
  fit, test, head = nonneg
  assert_scores(fit_score("knn", fit, test, head, preset="ninco"), ref_knn(fit, test, N_FIT))


@pytest.mark.slow
def test_nnguide(data):
  fit, test, head = data
  nrm = lambda x: f64(x) / np.linalg.norm(f64(x), axis=1, keepdims=True)
  guides = nrm(fit.features) * scipy.special.logsumexp(f64(fit.logits), axis=1)[:, None]
  sims = nrm(test.features) @ guides.T
  e = scipy.special.logsumexp(f64(test.logits), axis=1)
  for k in (1, 10):
    ref = e * np.sort(sims, axis=1)[:, ::-1][:, :k].mean(1)
    assert_scores(fit_score("nnguide", fit, test, head, alpha=1.0, k=k), ref)


def test_nnguide_bank_is_a_seeded_fraction(nonneg):
  fit, _, head = nonneg
  det = detectors.build("nnguide", alpha=0.25, seed=3)
  state = det.fit(fit, head)
  keep = stats.bernoulli_mask(3, 0, N_FIT, 0.25)
  assert int(state["n"]) == keep.sum() and 0.15 * N_FIT < keep.sum() < 0.35 * N_FIT
  guides = (f64(fit.features)[keep] / np.linalg.norm(f64(fit.features)[keep], axis=1,
                                                     keepdims=True)
            * scipy.special.logsumexp(f64(fit.logits)[keep], axis=1)[:, None])
  np.testing.assert_allclose(np.asarray(state["bank"])[:keep.sum()], guides, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- ODIN

def test_odin_equals_torch_reference():
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 5, 4, 3)).astype(np.float32)           # NHWC
  a = rng.normal(size=(3, 16)).astype(np.float32)
  bmat = rng.normal(size=(16, 7)).astype(np.float32)
  std = np.array([0.229, 0.224, 0.225], np.float32)

  def logits_fn(img):                                             # 1x1 conv, ReLU, GAP, linear
    return jnp.mean(jax.nn.relu(img @ a), axis=(1, 2)) @ bmat

  temp, eps = 10.0, 0.05
  det = detectors.build("odin", temperature=temp, epsilon=eps)
  got = np.asarray(det.score_inputs({}, logits_fn, x))

  xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)   # NCHW, as OpenOOD
  model = lambda t: torch.relu(torch.einsum("nchw,ck->nkhw", t, torch.tensor(a))).mean(
      (2, 3)) @ torch.tensor(bmat)
  out = model(xt)
  labels = out.argmax(1)
  loss = torch.nn.functional.cross_entropy(out / temp, labels)
  loss.backward()
  grad = (torch.ge(xt.grad, 0).float() - 0.5) * 2
  grad = grad / torch.tensor(std)[None, :, None, None]
  out2 = model(xt.detach() - eps * grad) / temp
  ref = torch.log_softmax(out2.double(), 1).max(1).values.numpy()
  assert_scores(got, ref)
  # inside the caller's jit too (how extraction calls it)
  jitted = jax.jit(lambda im: det.score_inputs({}, logits_fn, im))
  np.testing.assert_allclose(np.asarray(jitted(x)), got, rtol=1e-6)
  with pytest.raises(ValueError, match="score_inputs"):
    det.score({}, detectors.Outputs(np.zeros((2, 3)), np.zeros((2, 3))))
  assert "inputs" in det.needs and det.fit(None) == {}


# ----------------------------------------------------------------------------- streaming, state

_ALL_FIT = {"vim": {"dim": 20}, "residual": {"dim": 20}, "knn": {"k": 5},
            "nnguide": {"k": 5, "alpha": 0.3}, "tempscale": {"max_rows": 1000},
            "react": {"max_rows": 1000}, "weiper": {"repeats": 5},
            "weiper_kld": {"repeats": 5}, "neco": {"dim": 10}}


def _batches(out, sizes):
  i = 0
  for s in sizes:
    yield detectors.Outputs(out.features[i:i + s], out.logits[i:i + s], out.labels[i:i + s])
    i += s
  assert i == N_FIT


def _feature_logit(name):
  """Detectors that read only features, logits, labels and the head: not the input-gradient
  and layer ones (their own test files), nor those reading a text bank (test_zero_shot.py)."""
  cls = detectors.REGISTRY[name]
  return not ({"inputs", "layers"} & cls.needs or cls.text_bank)


@pytest.mark.parametrize("name", [n for n in detectors.names() if _feature_logit(n)])
def test_streaming_fit_and_state_roundtrip(nonneg, name, tmp_path, monkeypatch):
  """Batches (list or one-shot generator, uneven sizes, several chunks) and the set as JAX
  arrays (the pipeline's form; sliced through numpy views on the CPU) give bit-identical
  states to the whole set; a saved and loaded state scores identically."""
  fit, test, head = nonneg
  monkeypatch.setattr(stats, "CHUNK_ROWS", 128)
  det = detectors.build(name, **_ALL_FIT.get(name, {}))
  whole = det.fit(fit, head)
  sizes = [50, 100, 7, 200, 1, 242]
  as_list = det.fit(list(_batches(fit, sizes)), head)
  one_shot = det.fit(_batches(fit, sizes), head)
  on_device = det.fit(detectors.Outputs(
      *(None if x is None else jnp.asarray(x) for x in (fit.features, fit.logits, fit.labels))),
      head)
  for other in (as_list, one_shot, on_device):
    assert sorted(other) == sorted(whole)
    for k in whole:
      np.testing.assert_array_equal(np.asarray(other[k]), np.asarray(whole[k]), err_msg=k)
  s = np.asarray(det.score(whole, test))
  path = str(tmp_path / f"{name}.npz")
  detectors.save_state(path, whole)
  loaded = detectors.load_state(path)
  np.testing.assert_array_equal(np.asarray(det.score(loaded, test)), s)
  monkeypatch.setattr(stats, "CHUNK_ROWS", 16384)                 # one chunk: same to rounding
  np.testing.assert_allclose(np.asarray(det.score(det.fit(fit, head), test)), s,
                             rtol=1e-6, atol=1e-6 * np.abs(s).max())


def test_fit_chunks_of_cpu_jax_arrays_are_views_of_their_buffers():
  """stats.chunks slices a JAX array held by the CPU through its zero-copy numpy view: no chunk
  is copied (slicing the JAX array would dispatch a copy of each)."""
  x = jnp.asarray(np.arange(1000 * 3, dtype=np.float32).reshape(1000, 3))
  chunks = list(stats.chunks(detectors.Outputs(x, None), 128))
  assert [s for s, _ in chunks] == list(range(0, 1000, 128))
  for start, chunk in chunks:
    assert isinstance(chunk.features, np.ndarray)
    assert np.shares_memory(chunk.features, np.asarray(x))
    np.testing.assert_array_equal(chunk.features, np.asarray(x)[start:start + 128])


def test_row_sample_is_batching_independent_and_uniform():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1000, 3)).astype(np.float32)
  out = detectors.Outputs(x, x)
  samples = []
  for rows in (1000, 64, 7):
    smp = stats.RowSample(100, seed=5, fields=("features",))
    for start, chunk in stats.chunks(out, rows):
      smp.add(start, chunk)
    samples.append(smp.result())
  for s in samples[1:]:
    np.testing.assert_array_equal(s["rows"], samples[0]["rows"])
    np.testing.assert_array_equal(s["features"], x[s["rows"]])
  keys = stats.row_keys(5, 0, 1000)
  np.testing.assert_array_equal(samples[0]["rows"], np.sort(np.argsort(keys)[:100]))
  assert 30 < (samples[0]["rows"] < 500).sum() < 70


def test_react_subsampled_quantile(nonneg):
  fit, test, head = nonneg
  det = detectors.build("react", max_rows=200, seed=1)
  state = det.fit(fit, head)
  smp = stats.RowSample(200, 1, ("features",))
  smp.add(0, fit)
  rows = smp.result()["rows"]
  assert len(rows) == 200
  np.testing.assert_allclose(float(state["clip"]),
                             np.percentile(fit.features[rows].reshape(-1), 90), rtol=1e-6)


# ----------------------------------------------------------------------------- API

def test_registry_and_errors():
  names = detectors.names()
  assert len(names) >= 40 and len(set(names)) == len(names)
  assert {"msp", "vim", "knn", "odin", "mcm", "relative_cosine", "ash_b"} <= set(names)
  with pytest.raises(ValueError, match="valid:.*msp"):
    detectors.build("nope")
  with pytest.raises(ValueError, match=r"valid: \['bank_block', 'k', 'query_block'\]"):
    detectors.build("knn", K=3)
  with pytest.raises(ValueError, match="preset"):
    detectors.build("knn", preset="imagenet")
  with pytest.raises(ValueError, match="percentile"):
    detectors.build("react", percentile=120)
  assert detectors.build("knn", preset="ninco").hparams["k"] == 1000
  assert detectors.build("knn", preset="openood").hparams["k"] == 50
  assert detectors.build("react", preset="ninco").hparams["percentile"] == 99.0
  assert detectors.build("react", preset="openood").hparams["percentile"] == 90.0
  fit, test, head = make_data(False)
  with pytest.raises(ValueError, match="head"):
    detectors.build("react").fit(fit)
  with pytest.raises(ValueError, match="labels"):
    detectors.build("mds").fit(detectors.Outputs(fit.features, fit.logits), head)
  with pytest.raises(ValueError, match="features"):
    detectors.build("knn").score({}, detectors.Outputs(None, test.logits))
  for name in names:
    det = detectors.build(name)
    assert det.name == name and det.needs <= detectors.core.NEEDS


def test_state_is_arrays_only(nonneg):
  fit, _, head = nonneg
  for name in filter(_feature_logit, detectors.names()):   # odin: no fit
    state = detectors.build(name, **_ALL_FIT.get(name, {})).fit(fit, head)
    assert isinstance(state, dict)
    for v in jax.tree.leaves(state):
      assert isinstance(v, (jax.Array, np.ndarray)), (name, type(v))


# ----------------------------------------------------------------------------- multi-device

_SHARDED = textwrap.dedent("""
    import os, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from fi_jax import detectors
    assert jax.local_device_count() == 8
    z = np.load(sys.argv[1])
    fit = detectors.Outputs(z["hf"], z["zf"], z["yf"])
    test = detectors.Outputs(z["ht"], z["zt"])
    out = {}
    for name, hp in (("knn", dict(k=7, bank_block=40, query_block=64)),
                     ("knn", dict(k=600)), ("nnguide", dict(k=5, alpha=0.5))):
      det = detectors.build(name, **hp)
      state = det.fit(fit)
      sh = state["bank"].sharding
      assert len(sh.device_set) == 8 and sh.spec[0] == "bank", sh
      out[f"{name}{hp['k']}"] = np.asarray(det.score(state, test))
    np.savez(sys.argv[2], **out)
""")


@pytest.mark.slow
def test_knn_sharded_over_8_devices_equals_single(nonneg, tmp_path):
  fit, test, _ = nonneg
  data_path, out_path = tmp_path / "d.npz", tmp_path / "o.npz"
  np.savez(data_path, hf=fit.features, zf=fit.logits, yf=fit.labels, ht=test.features,
           zt=test.logits)
  env = dict(os.environ, XLA_FLAGS=subprocess_env.xla_flags(8),
             JAX_PLATFORMS="cpu", PYTHONPATH=os.getcwd())
  proc = subprocess.run([sys.executable, "-c", _SHARDED, str(data_path), str(out_path)],
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = np.load(out_path)
  for name, hp in (("knn", dict(k=7, bank_block=40, query_block=64)), ("knn", dict(k=600)),
                   ("nnguide", dict(k=5, alpha=0.5))):
    single = fit_score(name, fit, test, None, **hp)
    np.testing.assert_allclose(got[f"{name}{hp['k']}"], single, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- shared suite

@pytest.mark.slow
def test_shared_scope_gives_identical_scores_and_does_shared_work_once(nonneg, monkeypatch):
  """Inside detectors.shared(): every detector x preset scores exactly as it does alone, the
  class moments are computed in fewer passes, and KNN at k=1000 and k=50 runs one search."""
  fit, test, head = nonneg
  runs = [(n, p) for n in filter(_feature_logit, detectors.names()) for p in detectors.PRESETS]
  small = lambda r: ({"dim": 16} if r[0] in ("vim", "residual") and r[1] == "openood"
                     else {"dim": 10} if r[0] == "neco" else {})
  alone = {r: fit_score(r[0], fit, test, head, preset=r[1], **small(r)) for r in runs}

  calls = {"moments": 0, "topk": 0}
  real_moments, real_topk = stats._moments, knn_lib.knn_order_stats

  def count(kind, fn):
    def wrapped(*a, **kw):
      calls[kind] += 1
      return fn(*a, **kw)
    return wrapped
  monkeypatch.setattr(stats, "_moments", count("moments", real_moments))
  monkeypatch.setattr(knn_lib, "knn_order_stats", count("topk", real_topk))

  dets = {r: detectors.build(r[0], preset=r[1], **small(r)) for r in runs}
  with detectors.shared(dets.values()) as scope:
    together = {r: np.asarray(d.score(d.fit(fit, head), test)) for r, d in dets.items()}
    assert scope.hits > 0
  for r in runs:
    np.testing.assert_array_equal(together[r], alone[r], err_msg=str(r))
  # KNN (both k, also serving CombOOD's k=50) one search, NNGuide (identical presets) one search
  assert calls["topk"] == 2
  # label+scatter (MDS/RMDS, also serving cosine, fDBD, NCI, DICE, LINe and, every fit row
  # having a label, the plain scatter of SSD/NECO and ViM/Residual), correct (SHE), normalised
  # label+scatter (MDS++/RMDS++, also serving CombOOD), correct on the logits (OpenMax)
  assert calls["moments"] == 4
  assert not detectors.shared_active()


def test_shared_scope_knn_smaller_k_first_recomputes(nonneg):
  fit, test, _ = nonneg
  small, large = detectors.build("knn", k=5), detectors.build("knn", k=40)
  with detectors.shared():
    s_small = np.asarray(small.score(small.fit(fit), test))
    s_large = np.asarray(large.score(large.fit(fit), test))
  np.testing.assert_array_equal(s_small, fit_score("knn", fit, test, None, k=5))
  np.testing.assert_array_equal(s_large, fit_score("knn", fit, test, None, k=40))
