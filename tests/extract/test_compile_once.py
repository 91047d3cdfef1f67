"""Compile once: the demo compiles its forward step once (input scorers and layer reducers are
part of it; the fit set skips the scorers it does not need) and each detector's score once,
whatever the number and sizes of the sets; bf16 compute gives float32 outputs and AUROCs close
to float32 compute."""
from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

from configs import demo
from fi_jax import detectors, pipeline
from fi_jax.run import benchmark as run
from fi_jax.run import model as run_model
from tests.helpers.compilation import compilations

DETECTORS = ("msp", "energy", "odin", "mds", "knn", "react", "mdsens", "gram")




def _config(**model):
  c = demo.get_config("quick")
  c.detectors = DETECTORS
  c.detector_hparams = demo.get_config().detector_hparams
  c.compilation_cache_dir = ""   # count real compilations; nothing written to the home folder
  c.model.update(model)
  return c


@pytest.fixture(scope="module")
def f32_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("f32"))
  c = _config()
  run_model.LazyModel(c, print, workdir).get()   # train first: only the run is counted below
  # another test in this process (the same demo shapes) may have compiled the detectors'
  # scores already: jit's in-memory cache would then hide them from the count
  jax.clear_caches()
  with compilations() as counts:
    results = run.run(c, workdir, log=lambda s: None)
  return c, workdir, results, counts


@pytest.mark.slow
def test_demo_compiles_forward_once_and_each_score_once(f32_run):
  _, _, results, counts = f32_run
  sizes = results["meta"]["set_sizes"]
  assert len(sizes) == 3 and len(set(sizes.values())) == 3   # three sets of different sizes
  # one step for every set: the fit set runs it with ODIN switched off
  assert counts["jit(step)"] == 1, counts
  # one jitted score per detector (ODIN scores during extraction), whatever the set size
  assert 1 <= counts["jit(_score)"] <= len(DETECTORS) - 1, counts


@pytest.mark.slow
def test_bf16_compute_gives_float32_outputs_and_close_aurocs(f32_run):
  c32, workdir, results, _ = f32_run
  c16 = _config(dtype_mm="bfloat16")
  model = run_model.LazyModel(c16, print, workdir)
  model.params_cache = run_model.LazyModel(c32, print, workdir).params_cache   # the same weights
  dets = run.config_detectors(c16)
  sets = run.extract_cached(c16, model, workdir, lambda s: None, dets)
  for arrays in sets.values():
    assert arrays["features"].dtype == np.float32 and arrays["logits"].dtype == np.float32
  head = run_model.cached_head(c32, model, workdir)
  scores, errors = pipeline.score_sets(dets, sets, head)
  assert not errors
  auroc16 = {r["detector"]: r["auroc"] for r in pipeline.metric_rows(scores, sets)}
  auroc32 = {r["detector"]: r["auroc"] for r in results["rows"]}
  diff = {d: auroc16[d] - auroc32[d] for d in auroc32}
  print("AUROC bf16 - float32:", {d: f"{v:+.4f}" for d, v in diff.items()})
  assert sorted(diff) == sorted(DETECTORS)
  assert max(abs(v) for v in diff.values()) < 0.02, diff


@pytest.mark.slow
@pytest.mark.parametrize("name", ["msp", "energy", "mds", "knn", "react", "vim"])
def test_block_scoring_matches_one_call(name, monkeypatch):
  """Scores in blocks (the last one padded) equal one call on the whole set, up to float
  rounding (XLA vectorises differently for other shapes); rows never interact."""
  from fi_jax import detectors
  from fi_jax.detectors import core
  rng = np.random.default_rng(0)
  d, c = 16, 5
  w, b = rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)
  head = detectors.Head(jax.numpy.asarray(w), jax.numpy.asarray(b))

  def outputs(n):
    h = np.abs(rng.normal(size=(n, d))).astype(np.float32)
    return detectors.Outputs(jax.numpy.asarray(h), jax.numpy.asarray(h @ w + b),
                             jax.numpy.asarray(rng.integers(0, c, n)))
  hp = {"knn": dict(k=5), "vim": dict(dim=8)}.get(name, {})
  det = detectors.build(name, **hp)
  state = det.fit(outputs(200), head)
  test = outputs(150)
  monkeypatch.setattr(core, "SCORE_BLOCK", None)
  whole = np.asarray(det.score(state, test))
  monkeypatch.setattr(core, "SCORE_BLOCK", 64)   # 3 blocks, the last one padded by 42 rows
  blocked = np.asarray(det.score(state, test))
  assert blocked.shape == (150,)
  np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-12)


def _linear_model_and_batches():
  """(predict_fn, params, three batches of 8 images 2x2x3, batch i filled with i)."""
  import jax.numpy as jnp
  predict = lambda p, x: (x.reshape(len(x), -1) @ p["w"], x.reshape(len(x), -1))
  params = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((12, 3)), jnp.float32)}
  batches = [{"image": np.full((8, 2, 2, 3), i, np.float32), "label": np.zeros(8, np.int64),
              "group": np.zeros(8, np.int64), "_id": np.arange(8 * i, 8 * i + 8),
              "_mask": np.ones(8, bool)} for i in range(3)]
  return predict, params, batches


def test_a_later_forward_compiles_in_the_background_once():
  """chunks(..., warm=(other,)) compiles the other Forward's step in a background thread while
  the first set runs; the other Forward's own first step reuses it (one compile in all) and
  its rows are those of a Forward that was never warmed."""
  import threading

  import jax.numpy as jnp

  from fi_jax.common import distributed
  from fi_jax.extract import forward as extract
  threads: collections.Counter = collections.Counter()

  def listener(event, duration, **kw):
    del duration
    if event == "/jax/core/compile/backend_compile_duration" and kw.get("fun_name") == "jit(step)":
      background = threading.current_thread().name.startswith("fi_jax-compile")
      threads["background" if background else "caller"] += 1
  predict, params, batches = _linear_model_and_batches()
  mesh = distributed.data_mesh()
  scorer = {"sum": lambda p, x: jnp.sum(x.reshape(len(x), -1), 1)}
  plain = extract.Forward(predict, mesh)
  scored = extract.Forward(predict, mesh, input_scorers=scorer)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    list(plain.chunks(params, batches, warm=(scored,)))
    got = list(scored.chunks(params, batches))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert threads == {"caller": 1, "background": 1}, threads   # one each; scored's ahead
  want = list(extract.Forward(predict, mesh, input_scorers=scorer).chunks(params, batches))
  for g, w in zip(got, want, strict=True):
    assert sorted(g) == sorted(w) and all(np.array_equal(g[k], w[k]) for k in g)


def test_a_skipped_scorer_runs_nothing_and_leaves_no_column():
  """chunks(scorers=[]) on a Forward with an optional input scorer: the scorer never runs on
  the device (lax.cond), its column is not yielded, features and logits equal those of a
  Forward without scorers; with the scorer named, its column is there. A scorer that is not
  optional always runs (its column is dropped when not named). One compile for both calls."""
  import jax.numpy as jnp

  from fi_jax.common import distributed
  from fi_jax.extract import forward as extract
  calls = []

  def scorer(p, x):
    jax.debug.callback(lambda v: calls.append(len(v)), x[:, 0, 0, 0])
    return jnp.sum(x.reshape(len(x), -1), 1)
  predict, params, batches = _linear_model_and_batches()
  mesh = distributed.data_mesh()
  always = {"max": lambda p, x: jnp.max(x.reshape(len(x), -1), 1)}
  fwd = extract.Forward(predict, mesh, input_scorers={**always, "sum": scorer}, optional=["sum"])
  with compilations() as counts:
    skipped = fwd.extract(params, batches, scorers=[])
    jax.effects_barrier()
    assert calls == [] and "score/sum" not in skipped and "score/max" not in skipped
    scored = fwd.extract(params, batches)
    np.testing.assert_array_equal(fwd.extract(params, batches, scorers=["max"])["score/max"],
                                  np.repeat(np.arange(3.0), 8))
    jax.effects_barrier()
    assert sum(calls) == 24, calls   # once per row, by the full call: with "max" alone, skipped
  assert counts["jit(step)"] == 1, counts
  np.testing.assert_array_equal(scored["score/sum"], np.repeat(np.arange(3.0) * 12, 8))
  plain = extract.Forward(predict, mesh).extract(params, batches)
  assert sorted(plain) == sorted(skipped)
  for k in plain:
    np.testing.assert_array_equal(skipped[k], plain[k])
  with pytest.raises(ValueError, match=r"input scorers \['odin'\] are not in"):
    fwd.active(["odin"])
  with pytest.raises(ValueError, match=r"optional scorers \['odin'\] are not among"):
    extract.Forward(predict, mesh, input_scorers=always, optional=["odin"])


@pytest.mark.slow
def test_a_run_of_small_sets_scores_in_smaller_blocks(monkeypatch):
  """score_sets pads every scored set to the power of two above the largest one (here 512, not
  SCORE_BLOCK = 4096), with one compiled score for both sets, and the same scores as one call on
  the whole set; with a set above SCORE_BLOCK the blocks are SCORE_BLOCK rows again."""
  from fi_jax.detectors import core
  rng = np.random.default_rng(0)
  d, c = 16, 5
  w = rng.normal(size=(d, c)).astype(np.float32)
  b = rng.normal(size=c).astype(np.float32)
  head = pipeline.detectors.Head(jax.numpy.asarray(w), jax.numpy.asarray(b))

  def arrays(n):
    h = np.abs(rng.normal(size=(n, d))).astype(np.float32)
    return {"features": h, "logits": h @ w + b, "label": rng.integers(0, c, n)}
  sets = {"id_fit": arrays(400), "id_test": arrays(300), "ood/x": arrays(200)}
  dets = detectors.build_suite(["energy", "mds", "knn"])
  sizes = []
  real = core.score_blocks
  monkeypatch.setattr(core, "score_blocks",
                      lambda out, block: sizes.append(block) or real(out, block))
  jax.clear_caches()
  with compilations() as counts:
    blocked, errors = pipeline.score_sets(dets, sets, head)
  assert not errors and set(sizes) == {512}, sizes
  assert counts["jit(_score)"] == 3, counts   # one per detector for both set sizes
  monkeypatch.setattr(core, "SCORE_BLOCK", None)
  whole, _ = pipeline.score_sets(dets, sets, head)
  for name in dets:   # knn: float32 similarities, whose dot XLA vectorises by row count
    tol = 1e-6 if name == "knn" else 1e-12
    for s in ("id_test", "ood/x"):
      np.testing.assert_allclose(blocked[name][s], whole[name][s], rtol=tol, atol=tol)
  monkeypatch.setattr(core, "SCORE_BLOCK", 4096)
  sizes.clear()
  pipeline.score_sets({"energy": dets["energy"]}, {**sets, "ood/big": arrays(5000)}, head)
  assert set(sizes) == {4096}, sizes
