"""BATS, OptFS, LINe, WeiPer, WeiPer+KLD vs independent numpy references of the papers' official
code (read for facts): OptFSOOD @ 84f8f108a87479e7e2092b56d432823ce685a1fa (detector/ours.py),
LINe @ db5836ad849d5641d94eed95cb6a9293272e212c (models/route.py, precompute.py,
demo-imagenet.sh), WeiPer's OpenOOD integration (weiper_kldiv/utils.py: perturbed head,
batch_histogram, UniformKernel, kldiv). OpenOOD v1.5 @ 3c35632ee91b54b09d1f085d04f94744cece7d0b
ships none of these five postprocessors (no preset). Scores must match to 1e-6 relative on
signed and ReLU-like features, plus a ranking case where each beats MSP.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from fi_jax import detectors
from fi_jax.detectors import activation, core, stats, weiper
from tests.helpers.detector_reference import assert_scores, f64, fit_score, make_data

RTOL = 1e-6


@pytest.fixture(scope="module", params=[False, True], ids=["relu", "signed"])
def data(request):
  return make_data(request.param)


def lse_head(h, head):
  return scipy.special.logsumexp(f64(h) @ f64(head.w) + f64(head.b), axis=1)


# ----------------------------------------------------------------------------- references

def ref_bats(fit, test, head, lam):
  h = f64(fit.features)
  mu, sd = h.mean(0), h.std(0)
  return lse_head(np.clip(f64(test.features), mu - lam * sd, mu + lam * sd), head)


def ref_optfs(fit, test, head, score):
  hf, w = f64(fit.features), f64(head.w).T                 # w: [C, D] as torch
  lo, hi = np.quantile(hf, 1e-3), np.quantile(hf, 1 - 1e-3)
  width = (hi - lo) / 100.0
  left = np.arange(lo, hi, width)
  pred = f64(fit.logits).argmax(1)
  lc = w[pred] * hf
  contrib = np.array([np.mean(np.sum(((hf >= x) & (hf < x + width)) * lc, axis=1)) for x in left])
  theta = contrib / np.linalg.norm(contrib) * 1000
  ht = f64(test.features)
  fp = np.zeros_like(ht)
  for i, x in enumerate(left):
    fp += ((ht >= x) & (ht < x + width)) * ht * theta[i]
  if score == "energy":
    return lse_head(fp, head)
  return np.sum(w[f64(test.logits).argmax(1)] * fp, axis=1)


def ref_line(fit, test, head, p_w, p_a, clip):
  hf, y = f64(fit.features), np.asarray(fit.labels)
  wt = f64(head.w).T                                        # [C, D] as torch's fc.weight
  c, d = wt.shape
  info = np.zeros((d, c))                                   # mean over class rows of h * dz_y/dh
  for k in range(c):
    if (y == k).any():
      info[:, k] = (hf[y == k] * wt[k]).mean(0)
  contrib = info.T
  masked_w, mask_f = np.zeros((c, c, d)), np.zeros((c, d))
  for k in range(c):
    matrix = np.abs(contrib[k]) * wt
    masked_w[k] = wt * (matrix > np.percentile(matrix, p_w))
    mask_f[k] = contrib[k] > np.percentile(contrib[k], p_a)
  x = np.minimum(f64(test.features), clip)
  pred = (x @ wt.T + f64(head.b)).argmax(1)
  out = np.stack([masked_w[pred[i]] @ (x[i] * mask_f[pred[i]]) for i in range(len(x))])
  return scipy.special.logsumexp(out + f64(head.b), axis=1)


def ref_perturbed(head, r, delta, seed):
  w = f64(head.w).T                                         # [C, D]
  rng = np.random.default_rng(seed)
  blocks = []
  for _ in range(r):
    n = rng.standard_normal(w.shape)
    blocks.append(w + delta * n / np.linalg.norm(n, axis=1, keepdims=True)
                  * np.linalg.norm(w, axis=1, keepdims=True))
  wt = np.concatenate(blocks, 0).astype(np.float32)         # [r C, D] float32 (model dtype)
  return f64(wt), np.tile(f64(head.b), r)


def ref_weiper_logits(h, head, r, delta, seed):
  wt, bt = ref_perturbed(head, r, delta, seed)
  return f64(h) @ wt.T + bt


def ref_msp_mean(z, r):
  zs = z.reshape(len(z), r, -1)
  return np.exp(zs.max(-1) - scipy.special.logsumexp(zs, axis=-1)).mean(-1)


def ref_density(x, lo, hi, nbins):
  edges = np.linspace(lo, hi + 1e-8, nbins + 1)
  return np.stack([[np.mean((row >= edges[i]) & (row < edges[i + 1])) for i in range(nbins)]
                   for row in x])


def ref_smooth(q, size):
  left = (size - 1) // 2
  n = q.shape[1]
  idx = np.clip(np.arange(-left, n - left + size - 1), 0, n - 1)
  padded = q[:, idx]
  return np.stack([padded[:, i:i + size].mean(1) for i in range(n)], 1)


def ref_kl(p, q, size, eps):
  p_ = p + eps
  p_ = p_ / p_.sum()
  q_ = ref_smooth(q, size) + eps
  q_ = q_ / q_.sum(1, keepdims=True)
  return (p_ * np.log(p_ / q_)).sum(1) + (q_ * np.log(q_ / p_)).sum(1)


def ref_weiper_kld(fit, test, head, r, delta, seed, nbins=100, s1=20, s2=20, eps=0.01,
                   eps_noise=0.025, lam1=1.0, lam2=1.0):
  hf, ht = f64(fit.features), f64(test.features)
  zf, zt = (ref_weiper_logits(x, head, r, delta, seed) for x in (hf, ht))
  pf_h = ref_density(hf, hf.min(), hf.max(), nbins).mean(0)
  pf_z = ref_density(zf, zf.min(), zf.max(), nbins).mean(0)
  kl_h = ref_kl(pf_h, ref_density(ht, hf.min(), hf.max(), nbins), s1, eps)
  kl_z = ref_kl(pf_z, ref_density(zt, zf.min(), zf.max(), nbins), s2, eps_noise)
  return -(kl_h + lam1 * kl_z - lam2 * ref_msp_mean(zt, r))


# The official code's float32 arithmetic (mgranz/weiper @ 1c27a4f7458570f60091d9c581e7fad6e5e369d1,
# Weiper/OpenOOD/openood/postprocessors/weiper_kldiv/utils.py; torch's default dtype): the
# perturbed logits of float32 h and W~, its linspace for the edges, batch_histogram's fractions
# (two outer bins, then divided by the total), UniformKernel, kldiv, the mean softmax maximum.
F32 = np.float32


def ref32_logits(h, head, r, delta, seed):
  wt, bt = ref_perturbed(head, r, delta, seed)              # float32 values (the model dtype)
  return np.asarray(h, F32) @ wt.T.astype(F32) + bt.astype(F32)


def ref32_edges(lo, hi, nbins):
  steps = np.arange(nbins + 1, dtype=F32) / F32(nbins)
  lo, stop = F32(lo), F32(F32(hi) + F32(1e-8))
  return lo + steps * (stop - lo)


def ref32_density(x, edges):
  full = np.concatenate([[-np.inf], edges, [np.inf]]).astype(F32)
  dens = np.stack([((x >= full[i]) & (x < full[i + 1])).astype(F32).mean(1)
                   for i in range(len(full) - 1)], 1)
  return dens[:, 1:-1] / dens.sum(1, keepdims=True)


def ref32_kl(p, q, size, eps):
  q_ = ref_smooth(q, size).astype(F32) + F32(eps)
  p_ = p + F32(eps)
  p_, q_ = p_ / p_.sum(), q_ / q_.sum(1, keepdims=True)
  return (p_ * (np.log(p_) - np.log(q_))).sum(1) + (q_ * (np.log(q_) - np.log(p_))).sum(1)


def ref32_msp_mean(z, r):
  zs = z.reshape(len(z), r, -1)
  e = np.exp(zs - zs.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)).max(-1).mean(-1)


def ref32_weiper_kld(fit, test, head, r, delta, seed, nbins=100, s1=20, s2=20, eps=0.01,
                     eps_noise=0.025, lam1=1.0, lam2=1.0):
  """(scores, the fit and test perturbed logits, their edges)."""
  hf, ht = np.asarray(fit.features, F32), np.asarray(test.features, F32)
  zf, zt = (ref32_logits(x, head, r, delta, seed) for x in (hf, ht))
  eh, ez = ref32_edges(hf.min(), hf.max(), nbins), ref32_edges(zf.min(), zf.max(), nbins)
  kl_h = ref32_kl(ref32_density(hf, eh).mean(0), ref32_density(ht, eh), s1, eps)
  kl_z = ref32_kl(ref32_density(zf, ez).mean(0), ref32_density(zt, ez), s2, eps_noise)
  return -(kl_h + F32(lam1) * kl_z - F32(lam2) * ref32_msp_mean(zt, r)), (zf, zt), ez


# ----------------------------------------------------------------------------- equality

def test_bats(data):
  fit, test, head = data
  for lam in (1.05, 0.5):
    assert_scores(fit_score("bats", fit, test, head, lam=lam), ref_bats(fit, test, head, lam),
                  rtol=RTOL)


@pytest.mark.parametrize("score", ["energy", "vanilla"])
def test_optfs(data, score):
  fit, test, head = data
  assert_scores(fit_score("optfs", fit, test, head, score=score),
                ref_optfs(fit, test, head, score), rtol=RTOL)


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-3.7, 11.3), (1e-3, 2.9)])
def test_optfs_bins_equal_searchsorted(lo, hi):
  """The equal-width bin guess corrected by its neighbouring edges equals numpy's binary search
  on every entry, including the edges themselves, their neighbours and values out of range."""
  width = (hi - lo) / 100.0
  left = np.arange(lo, hi, width)
  rng = np.random.default_rng(0)
  edges = np.concatenate([left, left + width])
  h = np.concatenate([rng.uniform(lo - 1, hi + 1, 5000), edges, np.nextafter(edges, -np.inf),
                      np.nextafter(edges, np.inf), [lo - 1e9, hi + 1e9, -np.inf, np.inf]])
  h = h[(h == 0) | (np.abs(h) >= np.finfo(h.dtype).tiny)]   # XLA on CPU flushes subnormals
  i = np.searchsorted(left, h, side="right") - 1
  want = np.where((i >= 0) & (h < left[np.maximum(i, 0)] + width), i, -1)
  got = activation._bins_of(jnp.asarray(h), jnp.asarray(left), jnp.asarray(width))
  np.testing.assert_array_equal(np.asarray(got), want)


def test_line(data):
  fit, test, head = data
  clip = np.percentile(f64(fit.features), 90)
  assert_scores(fit_score("line", fit, test, head), ref_line(fit, test, head, 10, 10, clip),
                rtol=RTOL)
  assert_scores(fit_score("line", fit, test, head, p_w=50, p_a=30, clip=0.8, block_elems=5000),
                ref_line(fit, test, head, 50, 30, 0.8), rtol=RTOL)


@pytest.mark.parametrize("p", [0.0, 0.5, 10.0, 37.3, 50.0, 90.0, 99.9, 100.0])
def test_line_weight_thresholds_equal_numpy_percentile(p):
  """The bracketed selection of LINe's weight thresholds gives np.percentile's bits (D*C large
  enough for the bracket; p = 0 / 100 and tied products take the plain path or the fallback)."""
  rng = np.random.default_rng(1)
  w = rng.normal(size=(128, 600))
  w[:, :40] = 0.5                                        # ties among the products
  absc = np.abs(rng.normal(size=(12, 128)))
  absc[3] = 0.0                                          # a class with all-zero contributions
  want = np.array([np.percentile(a[:, None] * w, p) for a in absc])
  got = activation._line_weight_thresholds(absc, w, p)
  np.testing.assert_array_equal(got, want)


def test_entry_percentiles_are_numpy_percentiles_from_one_sort_in_a_scope(monkeypatch):
  """ReAct / VRA / LINe's clip percentiles: np.percentile's values bit for bit (any q, sizes from
  1, ties, NaN), read off one sorted copy of an entries array made once inside
  detectors.shared(), every time outside it."""
  rng = np.random.default_rng(3)
  for n in (1, 2, 7, 10_001):
    for x in (rng.standard_normal(n).astype(np.float32),
              rng.integers(0, 3, n).astype(np.float32),        # ties
              (np.abs(rng.standard_normal(n)) * 1e3).astype(np.float64)):
      qs = [0.0, 100.0, 50.0, 90.0, 99.0, *rng.uniform(0, 100, 5)]
      np.testing.assert_array_equal(activation.entry_percentiles(x, qs), np.percentile(x, qs))
  nan = np.array([1.0, np.nan, 2.0], np.float32)
  np.testing.assert_array_equal(activation.entry_percentiles(nan, [10, 90]), np.percentile(nan, [10, 90]))

  entries = rng.standard_normal(10_001).astype(np.float32)
  sorts = []
  real = np.sort
  monkeypatch.setattr(np, "sort", lambda a, *args, **kw: (sorts.append(a.size), real(a, *args, **kw))[1])
  want = lambda qs: np.percentile(entries, qs)
  with detectors.shared():
    np.testing.assert_array_equal(activation.entry_percentiles(entries, [10.0, 90.0]), want([10, 90]))
    np.testing.assert_array_equal(activation.entry_percentiles(entries, 90), want([90]))
    np.testing.assert_array_equal(activation.entry_percentiles(entries, [99, 10]), want([99, 10]))
    other = entries.copy()                      # another array: its own sort
    np.testing.assert_array_equal(activation.entry_percentiles(other, 90), want([90]))
  assert sorts == [entries.size, entries.size]
  sorts.clear()
  activation.entry_percentiles(entries, 90)
  activation.entry_percentiles(entries, 90)
  assert sorts == [entries.size, entries.size]


def test_line_class_sorted_blocks_equal_one_call(data, monkeypatch):
  """Scoring rows sorted by predicted class in blocks of SCORE_BLOCK rows (the last one padded
  with rows of no class) gives the scores of one call on the whole set, in the input order."""
  from fi_jax.detectors import core
  fit, test, head = data
  det = detectors.build("line", block_elems=3000)
  state = det.fit(fit, head)
  monkeypatch.setattr(core, "SCORE_BLOCK", None)
  whole = np.asarray(det.score(state, test))
  monkeypatch.setattr(core, "SCORE_BLOCK", 64)        # 3 blocks, the last one padded by 42 rows
  blocked = np.asarray(det.score(state, test))
  assert blocked.shape == whole.shape == (len(test.features),)
  np.testing.assert_allclose(blocked, whole, rtol=1e-12, atol=1e-12)
  # sets smaller than a block, of two sizes: the same scores, one compiled block program
  activation._line_sorted_block.clear_cache()
  for rows in (40, 25):
    part = detectors.Outputs(features=test.features[:rows], logits=test.logits[:rows])
    np.testing.assert_allclose(np.asarray(det.score(state, part)), whole[:rows], rtol=1e-12,
                               atol=1e-12)
  assert activation._line_sorted_block._cache_size() == 1


def test_weiper(data):
  fit, test, head = data
  for r, delta, seed in ((100, 2.1, 0), (7, 0.5, 3)):
    ref = np.log(ref_msp_mean(ref_weiper_logits(test.features, head, r, delta, seed), r))
    assert_scores(fit_score("weiper", fit, test, head, repeats=r, delta=delta, seed=seed,
                            block_rows=64, precision="float64"), ref, rtol=RTOL)


@pytest.mark.slow
@pytest.mark.parametrize("same_blocks", [True, False])
def test_weiper_reuses_weiper_kld_pass_in_a_shared_scope(data, monkeypatch, same_blocks):
  """Inside detectors.shared(), WeiPer+KLD scored first leaves WeiPer's scores: WeiPer's own
  product is skipped and its scores are those it computes alone, bit for bit. With other row
  blocks (or outside a scope) WeiPer computes them itself."""
  fit, test, head = data
  hp = dict(repeats=6, delta=1.3, seed=4)
  rows = 32 if same_blocks else 48
  alone = fit_score("weiper", fit, test, head, block_rows=32, **hp)
  kld_alone = fit_score("weiper_kld", fit, test, head, block_rows=rows, **hp)
  reused = []
  score_args = weiper.WeiPer._score_args

  def spy(self, state, outputs):
    out = score_args(self, state, outputs)
    reused.append(out[1] is not None)
    return out
  monkeypatch.setattr(weiper.WeiPer, "_score_args", spy)
  kld = detectors.build("weiper_kld", block_rows=rows, **hp)
  wp = detectors.build("weiper", block_rows=32, **hp)
  with detectors.shared([kld, wp]):
    kld_scores = np.asarray(kld.score(kld.fit(fit, head), test))
    wp_scores = np.asarray(wp.score(wp.fit(fit, head), test))
  assert reused and all(reused) == same_blocks and any(reused) == same_blocks
  np.testing.assert_array_equal(wp_scores, alone)
  np.testing.assert_array_equal(kld_scores, kld_alone)
  assert detectors.names().index("weiper_kld") < detectors.names().index("weiper")


def test_perturbed_head_is_the_seeded_draw(data):
  # bit for bit the float64 formula w + (delta |w_c| n / |n|)^T per repeat, cast to float32
  _, _, head = data
  w = f64(head.w)
  rng = np.random.default_rng(5)
  want = []
  for _ in range(3):
    n = rng.standard_normal((w.shape[1], w.shape[0]))
    n = n / np.linalg.norm(n, axis=1, keepdims=True)
    want.append(w + (0.7 * np.linalg.norm(w, axis=0)[:, None] * n).T)
  wt, bt = weiper.perturbed_head(head.w, head.b, repeats=3, delta=0.7, seed=5)
  np.testing.assert_array_equal(wt, np.concatenate(want, 1).astype(np.float32))
  np.testing.assert_array_equal(bt, np.tile(head.b, 3))


@pytest.mark.slow
def test_weiper_kld(data):
  fit, test, head = data
  assert_scores(fit_score("weiper_kld", fit, test, head, repeats=10, block_rows=40,
                          precision="float64"),
                ref_weiper_kld(fit, test, head, 10, 2.1, 0), rtol=RTOL)
  hp = dict(n_bins=30, smoothing=5, smoothing_perturbed=4, epsilon=0.02, epsilon_noise=0.01,
            lambda_1=2.0, lambda_2=0.5, precision="float64")
  got = fit_score("weiper_kld", fit, test, head, repeats=4, delta=1.0, seed=2, **hp)
  ref = ref_weiper_kld(fit, test, head, 4, 1.0, 2, nbins=30, s1=5, s2=4, eps=0.02,
                       eps_noise=0.01, lam1=2.0, lam2=0.5)
  assert_scores(got, ref, rtol=RTOL)
  # r C = 240 perturbed logits, 8 bins: Q_z is counted in pairs of entries (81 cells <= 120)
  got = fit_score("weiper_kld", fit, test, head, repeats=20, n_bins=8, smoothing=3,
                  smoothing_perturbed=2, precision="float64")
  assert_scores(got, ref_weiper_kld(fit, test, head, 20, 2.1, 0, nbins=8, s1=3, s2=2),
                rtol=RTOL)


def assert_float32_scores(got, ref, rtol=1e-5):
  """|got - ref| <= rtol max |ref| (float32 rounds scores near 0 to absolute, not relative,
  accuracy: the log of a mean MSP of 0.9992 carries float32's ulp of 1) and the same ranking
  where ref's gaps exceed that."""
  got, ref = f64(got), f64(ref)
  scale = np.abs(ref).max()
  assert np.abs(got - ref).max() <= rtol * scale, np.abs(got - ref).max() / scale
  order = np.argsort(ref, kind="stable")
  clear = np.diff(ref[order]) > 2 * rtol * scale
  assert (np.diff(got[order])[clear] > 0).all()


def test_weiper_float32_equals_the_official_float32_arithmetic(data):
  fit, test, head = data
  ref = np.log(ref32_msp_mean(ref32_logits(test.features, head, 7, 0.5, 3), 7))
  got = fit_score("weiper", fit, test, head, repeats=7, delta=0.5, seed=3, block_rows=64)
  assert_float32_scores(got, ref)


def test_weiper_kld_float32_equals_the_official_float32_arithmetic(data):
  # the default precision: float32 as the official code; its edges are the official float32
  # linspace of its float32 minimum and maximum. Two float32 matmuls (numpy's, XLA's) round
  # differently: the extremes (so the edges) may differ by ulps and a perturbed logit may cross
  # an edge; checked that none does here, so the scores must agree to float32 rounding.
  # (The fixture's -1e4 bias of its never-predicted class is replaced: it would put a cluster
  # of logits within ulps of the first edge.)
  fit, test, head = data
  head = detectors.Head(head.w, np.where(head.b < -1e3, np.float32(-3.0), head.b))
  hp = dict(n_bins=30, smoothing=5, smoothing_perturbed=4, epsilon=0.02, epsilon_noise=0.01,
            lambda_1=2.0, lambda_2=0.5)
  det = detectors.build("weiper_kld", repeats=6, delta=1.0, seed=2, block_rows=40, **hp)
  state = det.fit(fit, head)
  ref, (zf, zt), ez = ref32_weiper_kld(fit, test, head, 6, 1.0, 2, nbins=30, s1=5, s2=4,
                                       eps=0.02, eps_noise=0.01, lam1=2.0, lam2=0.5)
  assert state["edges_z"].dtype == jnp.float32 and state["dens_z"].dtype == jnp.float32
  ours_f, ours_t = (np.asarray(weiper._perturbed_logits(jnp.asarray(h), state["wt"], state["bt"],
                                                        6)).reshape(len(h), -1)
                    for h in (fit.features, test.features))
  assert ours_f.dtype == np.float32
  edges = np.asarray(state["edges_z"])
  np.testing.assert_array_equal(edges, ref32_edges(ours_f.min(), ours_f.max(), 30))
  np.testing.assert_allclose(edges, ez, rtol=0, atol=4 * np.spacing(np.abs(ez).max()))
  for ours, z in ((ours_f, zf), (ours_t, zt)):    # the same bin for every entry
    np.testing.assert_array_equal(np.searchsorted(edges, ours, "right"),
                                  np.searchsorted(ez, z, "right"))
  assert_float32_scores(np.asarray(det.score(state, test)), ref)


def ref_bin_index(x, edges):
  daz = lambda a: np.where(np.abs(a) < np.finfo(np.float64).tiny, 0.0, a)
  k = np.searchsorted(daz(edges), daz(x), side="right") - 1   # XLA on CPU reads subnormals as 0
  return np.where((k >= 0) & (k < len(edges) - 1), k, len(edges) - 1)


def bin_index_case(lo, hi, nb, seed=0):
  edges = np.linspace(lo, hi + 1e-8, nb + 1)
  x = np.concatenate([edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf),
                      np.random.default_rng(seed).uniform(lo - 1, hi + 1, 500),
                      [np.nan, np.inf, -np.inf, -0.0, 0.0]])
  e = jax.numpy.asarray(edges)
  fast = bool(core._guess_within_one_bin(e, e[0], nb / (e[-1] - e[0])))
  return edges, x, np.asarray(jax.jit(core.bin_index)(x[None], edges))[0], fast


@pytest.mark.parametrize("lo,hi,nb,fast", [
    (-3.7, 12.1, 100, True), (0.0, 1.0, 7, True), (-2.0, -1.5, 30, True), (5.0, 5.0, 10, True),
    (-1e-300, 1e-300, 16, True),
    (1e8, 1e8, 30, False)])   # a range of one ulp: 30 edges on two floats, binary search
def test_bin_index_equals_searchsorted(lo, hi, nb, fast):
  # the arithmetic bin guess + one-bin correction equals np.searchsorted on the float64
  # edges for entries on, just above and just below every edge, outside, +-inf and NaN
  edges, x, got, took_fast = bin_index_case(lo, hi, nb)
  assert took_fast == fast
  np.testing.assert_array_equal(got, ref_bin_index(x, edges))


@settings(max_examples=40, deadline=None)
@given(lo=st.floats(-1e12, 1e12), width=st.floats(0.0, 1e6), seed=st.integers(0, 9))
def test_bin_index_equals_searchsorted_any_range(lo, width, seed):
  edges, x, got, _ = bin_index_case(lo, lo + width, 20, seed)
  np.testing.assert_array_equal(got, ref_bin_index(x, edges))


@pytest.mark.parametrize("nb", [5, 20])   # 36 cells <= 150 pairs: counted in pairs; 441: not
def test_histograms_equal_reference(nb):
  x = np.random.default_rng(1).normal(size=(3, 301)) * 2
  x[0, :7] = [np.nan, np.inf, -np.inf, 9.0, -9.0, 0.0, 1.0]
  lo, hi = -3.0, 3.5
  got = np.asarray(weiper._histograms(x, np.linspace(lo, hi + 1e-8, nb + 1)))
  ref = ref_density(x, lo, hi, nb)
  np.testing.assert_array_equal(np.rint(got * 301), np.rint(ref * 301))   # the same counts
  np.testing.assert_allclose(got, ref, rtol=1e-15, atol=0)


@pytest.mark.slow
def test_weiper_kld_fit_in_row_blocks_equals_one_block(data, monkeypatch):
  # the fit runs in blocks of FIT_BLOCK_ROWS rows (bounded memory: [rows, r C] perturbed
  # logits per block); blocks of 37 rows (a shorter last block) give the one-block state
  fit, test, head = data
  det = detectors.build("weiper_kld", repeats=5, precision="float64")
  monkeypatch.setattr(weiper, "FIT_BLOCK_ROWS", 10 ** 6)
  whole = det.fit(fit, head)
  monkeypatch.setattr(weiper, "FIT_BLOCK_ROWS", 37)
  blocked = det.fit(fit, head)
  assert len(fit.features) > 2 * 37
  for k in ("edges_h", "edges_z"):
    np.testing.assert_array_equal(np.asarray(blocked[k]), np.asarray(whole[k]))
  for k in ("dens_h", "dens_z"):
    np.testing.assert_allclose(np.asarray(blocked[k]), np.asarray(whole[k]), rtol=1e-12, atol=0)


@pytest.mark.parametrize("ties", [False, True])
def test_weiper_kld_fit_minmax_equals_the_full_pass(data, monkeypatch, ties):
  # the float32 bounds pass + reruns of the blocks that may hold an extreme give the min / max
  # of a full compute-dtype pass bit for bit, rerunning few blocks (all blocks when every row
  # is the same and so holds both extremes)
  fit, _, head = data
  h = np.repeat(fit.features[:1], len(fit.features), 0) if ties else fit.features
  wt, bt = weiper.perturbed_head(head.w, head.b, repeats=6, delta=2.1, seed=0)
  monkeypatch.setattr(weiper, "FIT_BLOCK_ROWS", 20)
  full = [np.asarray(weiper._minmax_chunk(h[i:i + 20], wt, bt)) for i in range(0, len(h), 20)]
  want = [min(p[0] for p in full), max(p[1] for p in full), min(p[2] for p in full),
          max(p[3] for p in full)]
  reruns = []
  chunk = weiper._minmax_chunk
  monkeypatch.setattr(weiper, "_minmax_chunk", lambda *a: reruns.append(1) or chunk(*a))
  np.testing.assert_array_equal(weiper._fit_minmax(h, wt, bt), want)
  assert len(reruns) == len(full) if ties else 1 <= len(reruns) <= 4


def test_weiper_kld_logit_bounds_hold_every_row(data):
  # each row's float32-pass bounds contain the min and max of its compute-dtype perturbed
  # logits (numpy float64 here), on signed features spread over six orders of magnitude
  fit, _, head = data
  rng = np.random.default_rng(3)
  h = (fit.features * 10.0 ** rng.uniform(-3, 3, (len(fit.features), 1))).astype(np.float32)
  h[:5] = 0.0   # zero rows: the bound is the bias's rounding alone
  wt, bt = weiper.perturbed_head(head.w, head.b, repeats=6, delta=2.1, seed=0)
  wt_max = np.linalg.norm(np.asarray(wt, np.float64), axis=0).max()
  bounds, hmm = weiper._logit_bounds(jnp.asarray(h), jnp.asarray(wt), jnp.asarray(bt), wt_max)
  b = np.asarray(bounds, np.float64)
  z = np.asarray(h, np.float64) @ np.asarray(wt, np.float64) + np.asarray(bt, np.float64)
  zmin, zmax = z.min(1), z.max(1)
  assert np.all(b[0] <= zmin) and np.all(zmin <= b[1]), np.max(b[0] - zmin)
  assert np.all(b[2] <= zmax) and np.all(zmax <= b[3]), np.max(zmax - b[3])
  assert np.all(b[1] - b[0] < 1e-3 * (np.abs(zmin) + np.abs(zmax) + 1))   # and not vacuous
  np.testing.assert_array_equal(np.asarray(hmm), [h.min(), h.max()])


@pytest.mark.slow
def test_weiper_kld_subsampled_fit_uses_the_seeded_rows(data):
  fit, test, head = data
  smp = stats.RowSample(200, 0, ("features",))
  smp.add(0, fit)
  rows = smp.result()["rows"]
  sub = detectors.Outputs(fit.features[rows], fit.logits[rows], fit.labels[rows])
  assert_scores(fit_score("weiper_kld", fit, test, head, repeats=3, max_rows=200,
                          precision="float64"),
                ref_weiper_kld(sub, test, head, 3, 2.1, 0), rtol=RTOL)


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("name,hp,match", [
    ("bats", {"lam": 0.0}, "lam"), ("bats", {"lam": float("inf")}, "lam"),
    ("optfs", {"score": "msp"}, "score"), ("optfs", {"max_rows": 0}, "max_rows"),
    ("line", {"p_w": 101.0}, "p_w"), ("line", {"p_a": -1.0}, "p_a"),
    ("line", {"clip": -1.0}, "clip"), ("line", {"clip_percentile": 120.0}, "clip_percentile"),
    ("weiper", {"repeats": 0}, "repeats"), ("weiper", {"delta": 0.0}, "delta"),
    ("weiper", {"precision": "bfloat16"}, "precision"),
    ("weiper_kld", {"n_bins": 1}, "n_bins"), ("weiper_kld", {"smoothing": 200}, "smoothing"),
    ("weiper_kld", {"epsilon": 0.0}, "epsilon"), ("weiper_kld", {"lambda_1": -1.0}, "lambda_1"),
])
def test_hparam_validation(name, hp, match):
  with pytest.raises(ValueError, match=match):
    detectors.build(name, **hp)


def test_registered_with_paper_defaults():
  assert {"bats", "optfs", "line", "weiper", "weiper_kld"} <= set(detectors.names())
  assert detectors.hparams_of("bats")["lam"] == 1.05
  assert detectors.hparams_of("line")["p_w"] == 10.0 and detectors.hparams_of("line")["p_a"] == 10.0
  hp = detectors.hparams_of("weiper_kld", "openood")
  assert (hp["repeats"], hp["delta"], hp["n_bins"], hp["smoothing"]) == (100, 2.1, 100, 20)


# ----------------------------------------------------------------------------- beats MSP

def _auroc(id_s, ood_s):
  id_s, ood_s = f64(id_s), f64(ood_s)
  return float((id_s[:, None] > ood_s[None]).mean() + 0.5 * (id_s[:, None] == ood_s[None]).mean())


def _ranking_case(seed=0, n=400, per=8, c=4):
  """Each class owns `per` feature dims (weight 1 to its logit). ID rows spread their class
  evidence over all `per` dims (moderate activations); each OOD row is an ID-like row whose
  evidence sits on one dim as a single spike of the same total. The logits (hence MSP) are
  equal in distribution; the spike is an activation ID rows never have (BATS / LINe clip it,
  OptFS gives it no weight, the KLD sees an atypical histogram)."""
  rng = np.random.default_rng(seed)
  d = per * c
  w = np.zeros((d, c), np.float32)
  for k in range(c):
    w[k * per:(k + 1) * per, k] = 1.0
  b = np.zeros(c, np.float32)

  def rows(m, spike):
    h = np.abs(rng.normal(size=(m, d))) * 0.01
    y = rng.integers(0, c, m)
    vals = rng.uniform(0.5, 1.0, (m, per))
    for i in range(m):
      if spike:
        h[i, y[i] * per + rng.integers(per)] += vals[i].sum()
      else:
        h[i, y[i] * per:(y[i] + 1) * per] += vals[i]
    return h.astype(np.float32), y
  out = lambda h, y: detectors.Outputs(h, (h.astype(np.float64) @ w + b).astype(np.float32),
                                        y.astype(np.int32))
  fit, id_test, ood = out(*rows(n, False)), out(*rows(n, False)), out(*rows(n, True))
  return fit, id_test, ood, detectors.Head(w, b)


@pytest.mark.parametrize("name,hp", [("bats", {}), ("optfs", {}), ("line", {}),
                                     ("weiper_kld", {"repeats": 20})])
def test_beats_msp_on_atypical_activations(name, hp):
  fit, id_test, ood, head = _ranking_case()
  msp = detectors.build("msp")
  a_msp = _auroc(msp.score({}, id_test), msp.score({}, ood))
  det = detectors.build(name, **hp)
  state = det.fit(fit, head)
  a = _auroc(det.score(state, id_test), det.score(state, ood))
  assert a > a_msp + 0.1, (name, a, a_msp)


def _weiper_case(perp, seed=0, n=300, c=4, d=64):
  """Class k's weight is e_k (|w_k| = 1); every row's logits are its class's margin ~3 plus
  small noise, equal in distribution for ID and OOD (so MSP cannot separate them). ID rows have
  a small component (norm 0.5) orthogonal to every class weight, OOD rows a large one (`perp`).
  A perturbed class vector w_k + delta n picks up <n, h>, so the OOD rows' perturbed logits get
  noise of std ~ delta perp / sqrt(D) and the mean perturbed MSP drops (the MSP is concave in a
  positive margin): WeiPer measures how sensitive the MSP is to weight directions."""
  rng = np.random.default_rng(seed)
  w = np.zeros((d, c), np.float32)
  w[:c, :c] = np.eye(c)
  b = np.zeros(c, np.float32)

  def rows(m, perp_norm):
    h = np.zeros((m, d))
    y = rng.integers(0, c, m)
    h[:, :c] = rng.normal(size=(m, c)) * 0.1
    h[np.arange(m), y] += rng.uniform(2.8, 3.2, m)
    o = rng.normal(size=(m, d - c))
    h[:, c:] = o / np.linalg.norm(o, axis=1, keepdims=True) * perp_norm
    h = h.astype(np.float32)
    return detectors.Outputs(h, (h.astype(np.float64) @ w + b).astype(np.float32),
                             y.astype(np.int32))
  return rows(n, 0.5), rows(n, 0.5), rows(n, perp), detectors.Head(w, b)


def test_weiper_beats_msp_on_weight_sensitive_features():
  fit, id_test, ood, head = _weiper_case(6.0)
  msp = detectors.build("msp")
  a_msp = _auroc(msp.score({}, id_test), msp.score({}, ood))
  det = detectors.build("weiper")
  state = det.fit(fit, head)
  a = _auroc(det.score(state, id_test), det.score(state, ood))
  assert a_msp < 0.6 and a > 0.85, (a, a_msp)
