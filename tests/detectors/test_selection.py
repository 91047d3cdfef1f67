"""fi_jax.detectors.selection: the sort-free order statistics equal the lax.top_k reference path, the
order keys order floats (with -0.0 tied to +0.0), the bit-packed compaction is exact."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fi_jax.detectors import selection
from fi_jax.metrics import device as metrics

# jitted: one compilation per shape and ks (op by op, every call re-traces the searches)
row_order_stats = jax.jit(selection.row_order_stats, static_argnums=1)
reference_top_k = jax.jit(selection.reference_top_k, static_argnums=1)


def f64(x):
  return np.asarray(x, np.float64)


def assert_matches_reference(s, ks):
  """row_order_stats == reference_top_k: k-th largest equal as values (the sign of a zero
  k-th largest is not defined: -0.0 == +0.0), top-k sums to rounding of the summation order."""
  kth, top_sum = row_order_stats(jnp.asarray(s), ks)
  ref_kth, ref_sum = reference_top_k(jnp.asarray(s), ks)
  assert kth.shape == ref_kth.shape == (s.shape[0], len(ks))
  np.testing.assert_array_equal(np.asarray(kth), np.asarray(ref_kth), err_msg=str(ks))
  np.testing.assert_allclose(np.asarray(top_sum), np.asarray(ref_sum), rtol=1e-12,
                             err_msg=str(ks))


def tied_rows(rng):
  s = np.round(rng.normal(size=(10, 5000)), 1).astype(np.float32)   # many ties
  s[3, :] = 0.5                                                      # all equal: tie path
  s[4, 100:164] = 9.0                                                # top-k in one group
  s[5, ::2] = -np.inf                                                # masked entries
  s[6, :] = -np.abs(s[6, :])                                         # negative, -0.0 and 0.0
  s[7, :2500] = -0.0
  s[8, :] = rng.normal(size=5000).astype(np.float32)                 # no ties
  s[9, :] = (rng.choice([-1, 1], 5000) * 10.0 ** rng.uniform(-30, 30, 5000)).astype(np.float32)
  return np.concatenate([s, rng.permutation(np.tile(s, (25, 1)), axis=1)[:246]])  # 2 x 128


@pytest.mark.slow
def test_row_order_stats_is_exact_with_ties():
  """The grouped, sort-free selection gives the exact k-th largest value and top-k sum."""
  s = tied_rows(np.random.default_rng(0))
  for ks in ((1,), (5, 20), (300,), (1, 2500, 5000)):
    kth, top_sum = selection.row_order_stats(jnp.asarray(s), ks)
    desc = -np.sort(-s, axis=1)
    for j, k in enumerate(ks):
      np.testing.assert_array_equal(np.asarray(kth)[:, j], desc[:, k - 1], err_msg=str(k))
      np.testing.assert_allclose(np.asarray(top_sum)[:, j], f64(desc[:, :k]).sum(1),
                                 rtol=1e-12, err_msg=str(k))


@pytest.mark.parametrize("n", [1, 700, 4099])
def test_row_order_stats_equals_top_k_on_random_data(n):
  rng = np.random.default_rng(n)
  s = rng.normal(size=(9, n)).astype(np.float32)
  ks = sorted({1, max(1, n // 3), n})                                # k = 1 and k = n
  assert_matches_reference(s, tuple(ks))


@pytest.mark.slow
def test_row_order_stats_equals_top_k_with_ties_inf_and_signed_zeros():
  rng = np.random.default_rng(1)
  s = tied_rows(rng)
  for ks in ((1,), (7, 64, 1000, 4999, 5000)):
    assert_matches_reference(s, ks)
  z = rng.normal(size=(256, 3000)).astype(np.float32)               # 2 blocks of 128 rows
  z[:, rng.random(3000) < 0.3] = 0.0
  z[rng.random(z.shape) < 0.5] *= -1                                 # -0.0 and +0.0 mixed
  z[:3, :2000] = -np.inf
  assert_matches_reference(z, (1, 100, 900, 2999, 3000))


@pytest.mark.slow
def test_selection_merges_candidate_blocks_like_one_search():
  """top_groups of concatenated candidates (how KNN merges bank blocks and devices) gives the
  same order statistics as the whole row."""
  rng = np.random.default_rng(2)
  s = np.round(rng.normal(size=(6, 4096)), 2).astype(np.float32)
  k, g = 40, selection.group_size(2048, 40)

  @jax.jit
  def merged_stats(s):
    halves = [selection.top_groups(h.reshape(6, -1, g), k)[0] for h in jnp.split(s, 2, axis=1)]
    return selection.group_order_stats(
        selection.top_groups(jnp.concatenate(halves, axis=1), k), (1, 9, k))
  kth, top_sum = merged_stats(jnp.asarray(s))
  ref_kth, ref_sum = reference_top_k(s, (1, 9, k))
  np.testing.assert_array_equal(np.asarray(kth), np.asarray(ref_kth))
  np.testing.assert_allclose(np.asarray(top_sum), np.asarray(ref_sum), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [256, 200])      # 2 blocks of 128 rows; not a multiple of 128
def test_grouped_order_stats_equal_the_stacked_candidates_search(rows):
  """grouped_order_stats (each row block searched where its groups are made, as KNN's one-
  bank-block search) gives group_order_stats(top_groups(...)) bit for bit: masked entries,
  ties, both k and the float64 top-k sums."""
  rng = np.random.default_rng(3)
  s = np.round(rng.normal(size=(rows, 4096)), 2).astype(np.float32)
  k = 300
  g = selection.group_size(4096, k)
  valid = jnp.asarray(np.arange(4096) < 4000).reshape(-1, g)       # a padded bank's tail
  vals = jnp.asarray(s).reshape(rows, -1, g)
  stacked = jax.jit(lambda v: selection.group_order_stats(
      selection.top_groups(v, k, valid), (20, k)))(vals)
  grouped = jax.jit(lambda v: selection.grouped_order_stats(v, (20, k), valid))(vals)
  for a, b in zip(grouped, stacked):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ref_kth, _ = reference_top_k(s[:, :4000], (20, k))
  np.testing.assert_array_equal(np.asarray(grouped[0]), np.asarray(ref_kth))
  no_sums = jax.jit(lambda v: selection.grouped_order_stats(v, (k,), valid, sums=False))(vals)
  assert no_sums[1] is None
  np.testing.assert_array_equal(np.asarray(no_sums[0])[:, 0], np.asarray(ref_kth)[:, 1])


def test_kept_indices_are_the_true_columns_in_order():
  rng = np.random.default_rng(1)
  keep = rng.random((6, 200)) < np.array([0.0, 0.02, 0.3, 0.9, 1.0, 0.5])[:, None]
  keep[5, 31:33] = True                                   # across a word boundary
  got = np.asarray(selection.kept_indices(jnp.asarray(keep), 190))
  for row, idx in zip(keep, got):
    want = np.flatnonzero(row)[:190]
    np.testing.assert_array_equal(idx[:len(want)], want)
    assert (idx[len(want):] == 200).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_order_keys_order_floats_and_tie_signed_zeros(dtype):
  tiny = np.finfo(dtype).smallest_subnormal
  x = np.array([-np.inf, -np.finfo(dtype).max, -1.5, -tiny, -0.0, 0.0, tiny,
                np.finfo(dtype).tiny, 1.0, np.finfo(dtype).max, np.inf], dtype)
  keys = np.asarray(selection.order_key(jnp.asarray(x)))
  assert keys.dtype == (np.int32 if dtype == np.float32 else np.int64)
  assert keys[4] == keys[5] == 0                          # -0.0 and +0.0 are one value
  assert (np.diff(np.delete(keys, 4)) > 0).all()          # strictly increasing otherwise
  back = np.asarray(selection.from_order_key(jnp.asarray(keys)))
  np.testing.assert_array_equal(back.view(keys.dtype), np.where(x == 0, 0.0, x).astype(dtype)
                                .view(keys.dtype))       # bit round trip, zero as +0.0


def test_order_key_rejects_other_dtypes():
  with pytest.raises(TypeError, match="float32 or float64"):
    selection.order_key(jnp.zeros(3, jnp.bfloat16))


def test_signed_zeros_tie_in_metrics_and_selection():
  """-0.0 and +0.0 are the same score: the metrics count them as ties (AUROC 1/2 each) and
  the selection's k-th largest over them is zero whichever sign the k-th entry has."""
  id_scores = np.array([0.0, 0.0, -0.0, 1.0], np.float64)
  ood_scores = np.array([-0.0, -0.0, 0.0, -1.0], np.float64)
  plus = lambda x: np.where(x == 0, 0.0, x)              # every zero as +0.0
  flipped = metrics.ood_metrics(plus(id_scores), plus(ood_scores))
  got = metrics.ood_metrics(id_scores, ood_scores)
  # pairs: 1.0 beats all 4; each of 3 zeros beats -1.0 and ties 3 zeros
  assert got["auroc"] == pytest.approx((4 + 3 * (1 + 1.5)) / 16, abs=1e-15)
  for name in metrics.METRICS:
    assert got[name] == flipped[name], name          # the sign of a zero changes nothing
  s = np.array([[-0.0, 0.0, -1.0, -0.0, 2.0, 0.0]], np.float32)
  kth, top_sum = row_order_stats(s, (1, 2, 5, 6))
  np.testing.assert_array_equal(np.asarray(kth), [[2.0, 0.0, 0.0, -1.0]])
  assert not np.signbit(np.asarray(kth)[0, 1:3]).any()   # a zero order statistic is +0.0
  np.testing.assert_array_equal(np.asarray(top_sum), [[2.0, 2.0, 2.0, 1.0]])


def test_knn_search_is_compiled_without_the_tree_reduction_rewrite(monkeypatch):
  """KNN's search program is compiled with compile_options.selection_step(): on the CPU the
  tree-reduction rewrite off (its counting passes: one reduction each), passes the user
  disabled in XLA_FLAGS kept; the values equal the oracle's."""
  from fi_jax.common import compile_options
  from fi_jax.detectors import knn
  monkeypatch.setenv("XLA_FLAGS", "--xla_disable_hlo_passes=foo")
  assert compile_options.selection_step() == {
      "xla_disable_hlo_passes": "foo,tree_reduction_rewriter"}
  monkeypatch.delenv("XLA_FLAGS")
  assert compile_options.selection_step() == {"xla_disable_hlo_passes": "tree_reduction_rewriter"}
  seen = []
  real_jit = knn.jax.jit
  monkeypatch.setattr(knn.jax, "jit", lambda f, **kw: seen.append(kw) or real_jit(f, **kw))
  monkeypatch.setattr(knn, "_search", knn.selection_jit(knn._knn_order_stats,
                                                        static_argnames=knn._SEARCH_STATIC))
  rng = np.random.default_rng(3)
  bank = rng.normal(size=(256, 8)).astype(np.float32)
  q = rng.normal(size=(20, 8)).astype(np.float32)
  kth, top = knn.knn_order_stats(jnp.asarray(q), jnp.asarray(bank), jnp.int32(250), ks=(3, 17),
                                 query_block=8, bank_block=128)
  assert seen[-1]["compiler_options"] == compile_options.selection_step()
  ref_kth, ref_sum = selection.reference_top_k(jnp.asarray(q @ bank[:250].T), (3, 17))
  np.testing.assert_allclose(kth, ref_kth, rtol=1e-6)   # float32 products: rounding only
  np.testing.assert_allclose(top, ref_sum, rtol=1e-6)


@pytest.mark.parametrize("kind", ["normal"] + [pytest.param(k, marks=pytest.mark.slow)
                                              for k in ("rounded", "signed_zeros", "constant")])
def test_top_k_mask_and_indices_pick_lax_top_ks_entries(kind):
  """top_k_mask / top_k_indices select exactly lax.top_k's entries: its order (-0.0 below
  +0.0) and the lowest indices among ties, including more ties than room at the k-th."""
  rng = np.random.default_rng(7)
  for b, n, k in ((1, 1, 1), (5, 9, 4), (130, 300, 37), (256, 768, 77), (3, 1000, 1000)):
    x = rng.normal(size=(b, n)).astype(np.float32)
    if kind == "rounded":
      x = np.round(x, 1)
    elif kind == "signed_zeros":
      zeros = np.where(rng.random((b, n)) < 0.5, -0.0, 0.0).astype(np.float32)
      x = np.where(rng.random((b, n)) < 0.6, zeros, x)
    elif kind == "constant":
      x = np.full((b, n), 2.5, np.float32)
    idx = np.asarray(jax.lax.top_k(jnp.asarray(x), k)[1])
    want = np.zeros((b, n), bool)
    np.put_along_axis(want, idx, True, 1)
    np.testing.assert_array_equal(selection.top_k_mask(jnp.asarray(x), k), want)
    np.testing.assert_array_equal(selection.top_k_indices(jnp.asarray(x), k), np.sort(idx, 1))


@pytest.mark.slow
def test_detectors_with_selection_programs_compile_with_selection_step(monkeypatch):
  """CFOOD's and GEN's jitted scores (selection_program) get compile_options.selection_step()
  when first called; the others XLA's defaults."""
  from fi_jax import detectors
  from fi_jax.common import compile_options
  from fi_jax.detectors import core
  seen = {}
  real_jit = core.jax.jit

  def jit(f, **kw):
    seen[f.__self__.name] = kw
    return real_jit(f, **kw)
  monkeypatch.setattr(core.Detector, "_jit_cache", {})
  monkeypatch.setattr(core.jax, "jit", jit)
  rng = np.random.default_rng(0)
  h = np.abs(rng.normal(size=(40, 8))).astype(np.float32)
  z = rng.normal(size=(40, 5)).astype(np.float32)
  fit, test = detectors.Outputs(h, z, None), detectors.Outputs(h[:9], z[:9], None)
  for name in ("cfood", "gen", "msp"):
    det = detectors.build(name, **({"alpha": 1.0} if name == "cfood" else {}))
    assert np.isfinite(np.asarray(det.score(det.fit(fit), test))).all()
  assert seen["cfood"]["compiler_options"] == compile_options.selection_step()
  assert seen["gen"]["compiler_options"] == compile_options.selection_step()
  assert "compiler_options" not in seen["msp"]


def test_building_a_selection_detector_leaves_the_backend_unstarted():
  """The run layer sets XLA's flags after building the config's detectors: building one must
  not start JAX's backend (XLA reads its flags then)."""
  import subprocess
  import sys
  code = ("from fi_jax import detectors; from fi_jax.run import xla_flags; "
          "[detectors.build(n) for n in ('cfood', 'gen', 'knn', 'ash_p', 'scale')]; "
          "print(xla_flags.backend_started())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False"], out.stderr[-2000:]
