"""Layer detectors (mdsens, gram) and the layer extraction they read (fi_jax/extract/layer_columns.py):
equality with numpy/scipy references written from the papers / official code, a case where
they beat MSP, reducers on real model outputs, the extraction step, the cache and the
evaluator."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from sklearn.metrics import roc_auc_score

from configs import demo
from fi_jax import detectors, pipeline
from fi_jax.common import distributed
from fi_jax.detectors import Outputs, core, stats
from fi_jax.evaluators import ood
from fi_jax.extract import cache
from fi_jax.extract import forward as extract
from fi_jax.extract import layer_columns as layers
from fi_jax.models import _predictor, resnet, vit
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model

PP = "value_range(-1, 1, 0, 16)"


# ----------------------------------------------------------------------------- references

def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def ref_mdsens(fit, labels, test, num_classes):
  """Lee et al. / OpenOOD mds_ensemble without noise: per layer sklearn-style tied covariance
  of the class-centred rows (np.cov, bias), scipy pinvh, max_c -0.5 MD, summed (alpha = 1)."""
  total = 0.0
  for x, t in zip(fit, test):
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    mus = [x[labels == c].mean(0) for c in range(num_classes)]
    xc = np.concatenate([x[labels == c] - mus[c] for c in range(num_classes)])
    prec = scipy.linalg.pinvh(np.cov(xc, rowvar=False, bias=True))
    d = np.stack([np.einsum("nd,de,ne->n", t - m, prec, t - m) for m in mus], 1)
    total = total + np.max(-0.5 * d, 1)
  return total


def _delta(g, mins, maxs):
  """Sastry & Oore's deviation, summed over powers and channels."""
  return (np.maximum(mins - g, 0) / np.abs(mins + 1e-6)
          + np.maximum(g - maxs, 0) / np.abs(maxs + 1e-6)).sum((1, 2))


def ref_gram(fit, fit_logits, fit_labels, test, test_logits, *, powers, fit_classes, norm_conf,
             val_fraction=0.1, seed=0):
  """Gram deviations: class-wise min / max on the fit rows not held out, per-layer normaliser =
  mean held-out deviation (+1e-7), score = -sum_l dev_l / n_l / max softmax."""
  n, c = np.shape(fit_logits)
  held = stats.bernoulli_mask(seed, 0, n, val_fraction)     # the documented split convention
  cls = np.argmax(fit_logits, 1) if fit_classes == "pred" else np.asarray(fit_labels)
  conf_fit = _softmax(fit_logits).max(1)
  pred = np.argmax(test_logits, 1)
  dev = 0.0
  for g, t in zip(fit, test):
    g = np.asarray(g, np.float64)[:, :powers]
    t = np.asarray(t, np.float64)[:, :powers]
    rows = ~held & (cls >= 0)
    mins = np.stack([g[rows & (cls == k)].min(0) if (rows & (cls == k)).any()
                     else g[rows].min(0) for k in range(c)])
    maxs = np.stack([g[rows & (cls == k)].max(0) if (rows & (cls == k)).any()
                     else g[rows].max(0) for k in range(c)])
    h = held & (cls >= 0)
    dh = _delta(g[h], mins[cls[h]], maxs[cls[h]])
    if norm_conf:
      dh = dh / conf_fit[h]
    dev = dev + _delta(t, mins[pred], maxs[pred]) / (dh.mean() + 1e-7)
  return -dev / _softmax(test_logits).max(1)


def ref_gram_stat(x, p):
  """OpenOOD / official G_p on an activation [B, positions, C] in float64: r = row sums of
  (F^p)(F^p)^T with F = [C, positions]; sign(r)|r|^(1/p). Also sum_k |F_ck|^p sum_j |F_jk|^p,
  the scale of r's float32 rounding."""
  f = np.asarray(x, np.float64).transpose(0, 2, 1)
  fp = f ** p
  r = (fp @ fp.transpose(0, 2, 1)).sum(2)
  scale = (np.abs(f) ** p) @ (np.abs(f) ** p).sum(1)[..., None]
  return np.sign(r) * np.abs(r) ** (1.0 / p), r, scale[..., 0]


# ----------------------------------------------------------------------------- synthetic sets

def _layer_set(rng, n, dims, num_classes, *, relu, shift=None, labels=None):
  """Outputs with mean columns [n, D] and gram columns [n, 10, D] per block, class-dependent."""
  y = rng.integers(0, num_classes, n) if labels is None else labels
  extras = {}
  for i, (b, d) in enumerate(dims.items()):
    centres = np.random.default_rng(100 + i).normal(size=(num_classes, d))
    x = centres[y] + rng.normal(size=(n, d))
    if shift is not None and b in shift:
      x = x + shift[b]
    x = np.maximum(x, 0) if relu else x
    extras[layers.column("mean", b)] = x.astype(np.float32)
    g = x[:, None, :] * np.linspace(1.0, 2.0, layers.GRAM_POWERS)[None, :, None]
    g = g + 0.1 * rng.normal(size=g.shape)
    extras[layers.column("gram", b)] = (np.maximum(g, 0) if relu else g).astype(np.float32)
  logits = (2.0 * np.eye(num_classes)[y] + rng.normal(size=(n, num_classes))).astype(np.float32)
  feats = rng.normal(size=(n, 4)).astype(np.float32)
  return Outputs(jnp.asarray(feats), jnp.asarray(logits), jnp.asarray(y),
                 {k: jnp.asarray(v) for k, v in extras.items()})


DIMS = {"stem": 4, "stage1": 6, "stage2": 5}


def _cols(out, reducer, blocks=DIMS):
  return [np.asarray(out.extras[layers.column(reducer, b)]) for b in blocks]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("preset", [None, "openood"])
def test_mdsens_equals_reference(relu, preset):
  rng = np.random.default_rng(0)
  fit = _layer_set(rng, 400, DIMS, 3, relu=relu)
  test = _layer_set(rng, 50, DIMS, 3, relu=relu)
  det = detectors.build("mdsens", preset=preset)
  got = np.asarray(det.score(det.fit(fit), test))
  blocks = list(DIMS) if preset is None else ["stem"]
  ref = ref_mdsens(_cols(fit, "mean", blocks), np.asarray(fit.labels),
                   _cols(test, "mean", blocks), 3)
  np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("preset", [None, "openood"])
def test_gram_equals_reference(relu, preset):
  rng = np.random.default_rng(1)
  fit = _layer_set(rng, 400, DIMS, 3, relu=relu)
  test = _layer_set(rng, 60, DIMS, 3, relu=relu)
  hp = detectors.hparams_of("gram", preset)
  det = detectors.build("gram", preset=preset)
  got = np.asarray(det.score(det.fit(fit), test))
  ref = ref_gram(_cols(fit, "gram"), np.asarray(fit.logits), np.asarray(fit.labels),
                 _cols(test, "gram"), np.asarray(test.logits), powers=hp["powers"],
                 fit_classes=hp["fit_classes"], norm_conf=hp["norm_conf"])
  assert np.abs(ref).max() > 0
  np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-12)


def test_gram_class_without_fit_rows_uses_all_classes_and_layer_choice():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 3, 300)                          # class 3 of 4 never occurs
  fit = _layer_set(rng, 300, DIMS, 4, relu=False, labels=labels)
  test = _layer_set(rng, 40, DIMS, 4, relu=False)
  det = detectors.build("gram", fit_classes="label", powers=3, layers="stage2,stem")
  got = np.asarray(det.score(det.fit(fit), test))
  blocks = ["stem", "stage2"]
  ref = ref_gram(_cols(fit, "gram", blocks), np.asarray(fit.logits), labels,
                 _cols(test, "gram", blocks), np.asarray(test.logits), powers=3,
                 fit_classes="label", norm_conf=True)
  np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mdsens", "gram"])
def test_fit_on_batches_equals_fit_on_the_whole_set(name, monkeypatch):
  """Uneven batches (a list or a one-shot generator, several fit chunks) give bit-identical
  states to the whole set."""
  monkeypatch.setattr(stats, "CHUNK_ROWS", 64)
  rng = np.random.default_rng(3)
  fit = _layer_set(rng, 300, DIMS, 3, relu=False)
  test = _layer_set(rng, 30, DIMS, 3, relu=False)
  cuts = [0, 70, 71, 200, 300]
  part = lambda x, a, b: None if x is None else x[a:b]
  batches = [Outputs(part(fit.features, a, b), part(fit.logits, a, b), part(fit.labels, a, b),
                     {k: v[a:b] for k, v in fit.extras.items()}) for a, b in zip(cuts, cuts[1:])]
  det = detectors.build(name)
  whole = det.fit(fit)
  for other in (det.fit(batches), det.fit(iter(batches))):
    flat_w, flat_o = jax.tree_util.tree_leaves_with_path(whole), jax.tree.leaves(other)
    assert jax.tree.structure(other) == jax.tree.structure(whole)
    for (path, w), o in zip(flat_w, flat_o):
      np.testing.assert_array_equal(np.asarray(o), np.asarray(w), err_msg=str(path))
  assert np.isfinite(np.asarray(det.score(whole, test))).all()


@pytest.mark.slow
def test_shared_scope_gives_identical_scores_and_shares_class_moments(monkeypatch):
  rng = np.random.default_rng(8)
  fit = _layer_set(rng, 300, DIMS, 3, relu=True)
  test = _layer_set(rng, 30, DIMS, 3, relu=True)
  runs = [(n, p) for n in ("mdsens", "gram") for p in (None, "openood")]
  alone = {}
  for n, p in runs:
    det = detectors.build(n, preset=p)
    alone[n, p] = np.asarray(det.score(det.fit(fit), test))
  calls = []
  real = stats._moments
  monkeypatch.setattr(stats, "_moments", lambda *a, **kw: calls.append(1) or real(*a, **kw))
  dets = {r: detectors.build(r[0], preset=r[1]) for r in runs}
  with detectors.shared(dets.values()):
    for r, det in dets.items():
      np.testing.assert_array_equal(np.asarray(det.score(det.fit(fit), test)), alone[r])
  assert len(calls) == len(DIMS)    # mdsens "first" (openood) reuses the stem's moments


@pytest.mark.slow
def test_nonfinite_drop_keeps_the_layer_columns_row_aligned():
  rng = np.random.default_rng(4)
  fit = _layer_set(rng, 300, DIMS, 3, relu=False)
  test = _layer_set(rng, 30, DIMS, 3, relu=False)
  bad = Outputs(fit.features, fit.logits.at[5, 0].set(jnp.nan), fit.labels, fit.extras)
  keep = np.arange(300) != 5
  clean = Outputs(fit.features[keep], fit.logits[keep], fit.labels[keep],
                  {k: v[keep] for k, v in fit.extras.items()})
  for name in ("mdsens", "gram"):
    det = detectors.build(name)
    np.testing.assert_allclose(np.asarray(det.score(det.fit(bad, nonfinite="drop"), test)),
                               np.asarray(det.score(det.fit(clean), test)), rtol=1e-12)


@pytest.mark.parametrize("name", ["mdsens", "gram"])
def test_block_scoring_matches_one_call(name, monkeypatch):
  """[N, ...] extras go through the padded score blocks like features and logits."""
  rng = np.random.default_rng(9)
  det = detectors.build(name)
  state = det.fit(_layer_set(rng, 300, DIMS, 3, relu=False))
  test = _layer_set(rng, 150, DIMS, 3, relu=False)
  monkeypatch.setattr(core, "SCORE_BLOCK", None)
  whole = np.asarray(det.score(state, test))
  monkeypatch.setattr(core, "SCORE_BLOCK", 64)   # 3 blocks, the last one padded
  np.testing.assert_allclose(np.asarray(det.score(state, test)), whole, rtol=1e-12)


@pytest.mark.slow
def test_layer_detectors_beat_msp_when_ood_differs_in_an_early_layer():
  rng = np.random.default_rng(5)
  fit = _layer_set(rng, 600, DIMS, 3, relu=True)
  id_test = _layer_set(rng, 200, DIMS, 3, relu=True)
  # OOD: logits and later blocks drawn exactly like ID; only the stem is shifted
  ood_set = _layer_set(rng, 200, DIMS, 3, relu=True, shift={"stem": 2.5})
  y = np.r_[np.ones(200), np.zeros(200)]
  auroc = {}
  for name in ("msp", "mdsens", "gram"):
    det = detectors.build(name)
    state = det.fit(fit)
    auroc[name] = roc_auc_score(y, np.r_[np.asarray(det.score(state, id_test)),
                                         np.asarray(det.score(state, ood_set))])
  assert auroc["msp"] < 0.6, auroc
  assert auroc["mdsens"] > 0.95 and auroc["gram"] > 0.9, auroc


def test_errors_name_what_is_wrong():
  rng = np.random.default_rng(6)
  fit = _layer_set(rng, 100, DIMS, 3, relu=False)
  plain = Outputs(fit.features, fit.logits, fit.labels)
  with pytest.raises(ValueError, match=r"layer/gram/<block>.*no per-block outputs.*resnet"):
    detectors.build("gram").fit(plain)
  with pytest.raises(ValueError,
                     match=r"block\(s\) \['stage9'\].*\['stem', 'stage1', 'stage2'\]"):
    detectors.build("mdsens", layers="stem,stage9").fit(fit)
  state = detectors.build("mdsens").fit(fit)
  with pytest.raises(ValueError, match="layer/mean/<block>"):
    detectors.build("mdsens").score(state, plain)
  with pytest.raises(ValueError, match=r"powers=11 is out of range; valid: an integer in \[1, "):
    detectors.build("gram", powers=11)
  with pytest.raises(ValueError, match="layers='a b'"):
    detectors.build("gram", layers="a b")
  with pytest.raises(ValueError, match="fit_classes"):
    detectors.build("gram", fit_classes="true")
  with pytest.raises(ValueError, match="no fit row was held out"):
    detectors.build("gram", val_fraction=1e-6).fit(fit)


@pytest.mark.slow
def test_state_round_trip(tmp_path):
  rng = np.random.default_rng(7)
  fit = _layer_set(rng, 200, DIMS, 3, relu=False)
  test = _layer_set(rng, 20, DIMS, 3, relu=False)
  for name in ("mdsens", "gram"):
    det = detectors.build(name)
    state = det.fit(fit)
    detectors.save_state(str(tmp_path / f"{name}.npz"), state)
    back = detectors.load_state(str(tmp_path / f"{name}.npz"))
    np.testing.assert_array_equal(np.asarray(det.score(back, test)),
                                  np.asarray(det.score(state, test)))


# ----------------------------------------------------------------------------- reducers

def _check_reducers(acts: dict, cols: dict):
  assert set(cols) == {layers.column(r, b) for r in ("mean", "gram") for b in acts}
  for b, a in acts.items():
    x = np.asarray(a, np.float64)
    pos = x.reshape(x.shape[0], -1, x.shape[-1])
    np.testing.assert_allclose(cols[layers.column("mean", b)], pos.mean(1), rtol=1e-5,
                               atol=1e-6 * np.abs(pos).max())
    g = np.asarray(cols[layers.column("gram", b)], np.float64)
    assert g.shape == (x.shape[0], layers.GRAM_POWERS, x.shape[-1])
    for p in range(1, layers.GRAM_POWERS + 1):
      ref, r, scale = ref_gram_stat(pos, p)
      got = g[:, p - 1]
      # the float32 error bound of r, and the statistic itself where r is well conditioned
      np.testing.assert_array_less(np.abs(np.sign(got) * np.abs(got) ** p - r),
                                   1e-5 * scale + 1e-300)
      ok = np.abs(r) >= 0.5 * scale       # all entries for non-negative activations
      np.testing.assert_allclose(got[ok], ref[ok], rtol=3e-5)


def _blocks_and_columns(model, x):
  """A random-init model's block outputs and their reduced columns, from one jitted call."""
  params = jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]

  def f(p, im):
    out = model.apply({"params": p}, im)[1]
    return layers.blocks(out), layers.columns(out, ("mean", "gram"))
  acts, cols = jax.device_get(jax.jit(f)(params, x))
  return {k: acts[k] for k in layers.order(acts)}, cols   # jit returns dicts key-sorted


@pytest.mark.slow
def test_reducers_equal_numpy_on_a_tiny_vit():
  model = vit.Model(5, patch_size=(4, 4), width=16, depth=2, mlp_dim=32, num_heads=2)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 16, 16, 3)), jnp.float32)
  acts, cols = _blocks_and_columns(model, x)
  assert list(acts) == ["block00", "block01"] and acts["block00"].shape == (3, 16, 16)
  _check_reducers(acts, cols)


@pytest.mark.slow
def test_reducers_equal_numpy_on_a_tiny_resnet():
  model = resnet.Model(5, variant="resnet18", depths=(1, 1, 1, 1), widths=(8, 8, 8, 8),
                       stem_width=8)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 16, 16, 3)), jnp.float32)
  acts, cols = _blocks_and_columns(model, x)
  assert list(acts) == ["stem", "stage1", "stage2", "stage3", "stage4"]
  _check_reducers(acts, cols)


def test_gram_reducer_does_not_overflow_float32():
  x = np.abs(np.random.default_rng(2).normal(size=(2, 4, 4, 6))) * 300 + 1
  got = np.asarray(layers.reduce_gram(jnp.asarray(x, jnp.float32)))
  f10 = x.astype(np.float32).reshape(2, 16, 6).transpose(0, 2, 1) ** 10
  with np.errstate(over="ignore", invalid="ignore"):
    naive = (f10 @ f10.transpose(0, 2, 1)).sum(2)
  assert np.isinf(naive).all()               # the plain float32 form overflows here
  for p in (1, 5, 10):
    np.testing.assert_allclose(got[:, p - 1], ref_gram_stat(x.reshape(2, 16, 6), p)[0],
                               rtol=1e-5)


def test_block_layouts_and_the_unknown_layout_error():
  z = jnp.zeros((2, 3, 3, 4))
  t = jnp.zeros((2, 5, 4))
  assert list(layers.blocks({"stage0": z, "stem": z, "stage1": z, "pre_logits": z[:, 0, 0]})) \
      == ["stem", "stage0", "stage1"]                                       # convnext / swin
  clip_out = {"img/encoder": {f"block{i:02d}": {"+mlp": t, "sa": t} for i in (10, 2)},
              "pre_logits": t[:, 0]}
  assert list(layers.blocks(clip_out)) == ["block02", "block10"]             # clip / siglip
  with pytest.raises(ValueError, match=r"No per-block outputs.*\['pre_logits'\].*vit.*resnet"):
    layers.blocks({"pre_logits": t[:, 0]})
  assert layers.blocks({"pre_logits": t[:, 0]}, strict=False) == {}
  with pytest.raises(ValueError, match="Unknown layer reducer"):
    layers.check_reducers(["mean", "max"])


# ----------------------------------------------------------------------------- extraction

def _tiny_vit():
  """A random tiny ViT with a random head (a zero head gives constant logits: MSP degenerate)."""
  model = vit.Model(3, patch_size=(2, 2), width=16, depth=2, mlp_dim=32, num_heads=2,
                    head_zeroinit=False)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))["params"]
  return model, params


@pytest.mark.slow
def test_forward_with_layers_keeps_features_logits_and_adds_the_columns():
  model, params = _tiny_vit()
  predict, _ = run_model.default_predictor(model, params, None)
  rng = np.random.default_rng(0)
  batch = {"image": rng.normal(size=(8, 8, 8, 1)).astype(np.float32),
           "label": np.arange(8) % 3, "group": -np.ones(8, np.int64), "_id": np.arange(8),
           "_mask": np.arange(8) < 6}
  mesh = distributed.data_mesh()
  plain = extract.Forward(predict, mesh).extract(params, [batch])
  reducers = pipeline.layer_reducers(detectors.build_suite(["msp", "gram", "mdsens"]))
  assert reducers == ("gram", "mean") and pipeline.layer_reducers({}) == ()
  fwd = extract.Forward(predict, mesh, layers=reducers, predict_out=_predictor.out_variant(predict))
  got = fwd.extract(params, [batch])
  for k, v in plain.items():
    np.testing.assert_array_equal(got[k], v)
  _, out = model.apply({"params": params}, jnp.asarray(batch["image"][:6]))
  acts = jax.device_get(layers.blocks(out))
  assert set(got) == set(plain) | {layers.column(r, b) for r in reducers for b in acts}
  _check_reducers(acts, {k: v for k, v in got.items() if layers.is_column(k)})
  with pytest.raises(ValueError, match="needs predict_out"):
    extract.Forward(predict, mesh, layers=("gram",))


def test_cache_round_trip_keeps_the_layer_columns(tmp_path):
  rng = np.random.default_rng(0)
  arrays = {"features": rng.normal(size=(5, 3)).astype(np.float32),
            "logits": rng.normal(size=(5, 2)).astype(np.float32), "label": np.arange(5),
            layers.column("gram", "block00"): rng.normal(size=(5, 10, 4)).astype(np.float32),
            layers.column("mean", "stem"): rng.normal(size=(5, 4)).astype(np.float32)}
  cache.save(str(tmp_path / "entry"), arrays)
  back = cache.load(str(tmp_path / "entry"))
  assert set(back) == set(arrays)
  for k, v in arrays.items():
    np.testing.assert_array_equal(back[k], v)
  assert pipeline.column_names(["odin"], ()) == ["odin"]
  assert pipeline.column_names(["odin"], ("gram", "mean")) == ["odin", "layer/gram", "layer/mean"]


@pytest.fixture(scope="module")   # trains the quick demo model (tens of seconds)
def demo_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("layers_demo"))
  c = demo.get_config("quick")
  c.detectors = ("msp", "mdsens", "gram")
  c.compilation_cache_dir = ""
  results = run.run(c, workdir, log=lambda s: None)
  return c, workdir, results


@pytest.mark.slow
def test_demo_runs_the_layer_detectors_and_caches_their_columns(demo_run):
  c, workdir, results = demo_run
  rows = {r["detector"]: r for r in results["rows"]}
  assert set(rows) == {"msp", "mdsens", "gram"}
  assert all(0.0 <= rows[d]["auroc"] <= 1.0 for d in rows)
  model = run_model.LazyModel(c, print, workdir)
  dets = run.config_detectors(c)
  sets = run.extract_cached(c, model, workdir, lambda s: None, dets)   # all from the cache
  assert model._built is None  # no model was needed
  cols = [k for k in sets["id_fit"] if layers.is_column(k)]
  assert sorted(cols) == sorted(layers.column(r, b) for r in ("gram", "mean")
                                for b in ("block00", "block01"))
  assert sets["ood/digits_6-9"][layers.column("gram", "block01")].shape[1:] == (10, 64)
  # without layer detectors the sets are cached under their old key (no layer columns)
  c2 = demo.get_config("quick")
  c2.detectors = ("msp",)
  plain = run.extract_cached(c2, model, workdir, lambda s: None, run.config_detectors(c2))
  assert not any(layers.is_column(k) for k in plain["id_fit"])
  np.testing.assert_array_equal(plain["id_test"]["logits"], sets["id_test"]["logits"])
  entries = os.listdir(os.path.dirname(cache.set_dir(os.path.join(workdir, "cache"),
                                                     run_model.model_key(c), "id_fit")))
  assert len([e for e in entries if e.startswith("id_fit-")]) == 2, entries


# ----------------------------------------------------------------------------- evaluator

@pytest.mark.slow
@pytest.mark.parametrize("with_blocks", [pytest.param(True, marks=pytest.mark.slow), False])
def test_evaluator_runs_layer_detectors_or_fails_them_alone(with_blocks):
  model, params = _tiny_vit()

  def predict_fn(ts, batch):
    logits, out = model.apply({"params": ts["params"]}, batch["image"])
    return logits, (out if with_blocks else {"pre_logits": out["pre_logits"]})
  ev = ood.Evaluator(
      predict_fn, batch_size=32, devices=jax.devices(), pp_fn=PP,
      id_fit=dict(source="digits", split="train", classes=(0, 1, 2)),
      id_test=dict(source="digits", split="test", classes=(0, 1, 2)),
      ood={"rest": dict(source="digits", split="test", classes=(7, 8, 9), id_classes=(0, 1, 2))},
      detectors=("msp", "mdsens", "gram"))
  got = dict(ev.run({"params": params}))
  assert "rest/msp/auroc" in got
  for name in ("mdsens", "gram"):
    if with_blocks:
      assert 0 <= got[f"rest/{name}/auroc"] <= 1 and f"failed/{name}" not in got
    else:
      assert got[f"failed/{name}"] == 1.0 and f"rest/{name}/auroc" not in got
