"""The leaderboard's statistics: the hardness bootstrap's thresholds from draw counts equal the
resampled scores' own (ties and the rare long path included), and the Friedman statistic, its
p-value and the Nemenyi q equal scipy's and Demšar's table."""
import math

import numpy as np
import pytest
from scipy import stats

from fi_jax.metrics import hardness, ranking
from fi_jax.metrics.reference import fpr_at_tpr


@pytest.mark.parametrize("n", [1, 19, 120, 1000])
@pytest.mark.parametrize("short", [False, True])
def test_thresholds_from_counts_equal_the_resampled_fpr(n, short):
  rng = np.random.default_rng(n)
  ids = np.round(rng.normal(size=(5, n)), 1)   # rounded: many ties
  ood = np.round(rng.normal(size=(5, 40)), 1)
  th = hardness._Thresholds(ids, 0.95)
  if short:   # every row takes the path for too few draws among the lowest scores
    th.head = max(1, th.low - 1)
  for _ in range(30):
    i, o = rng.integers(0, n, n), rng.integers(0, 40, 40)
    got = hardness._fpr_at(ood, o, th(np.bincount(i, minlength=n)))
    assert np.array_equal(got, hardness.fpr_rows(ids, ood, 0.95, i, o))
    assert got.tolist() == [fpr_at_tpr(ids[p, i], ood[p, o]) for p in range(5)]


def test_friedman_and_nemenyi():
  rng = np.random.default_rng(0)
  v = rng.integers(0, 4, (7, 5)).astype(float)   # ties within blocks
  fr = ranking.friedman(v)
  ref = stats.friedmanchisquare(*v.T)
  assert fr["chi2"] == pytest.approx(ref.statistic, rel=1e-12)
  assert fr["p"] == pytest.approx(ref.pvalue, rel=1e-9)
  assert fr["mean_ranks"] == pytest.approx(stats.rankdata(v, axis=1).mean(0).tolist())
  n, k = v.shape
  assert fr["iman_davenport_f"] == pytest.approx((n - 1) * fr["chi2"] / (n * (k - 1) - fr["chi2"]))
  assert fr["cd"] == pytest.approx(fr["q_alpha"] * math.sqrt(k * (k + 1) / (6 * n)))
  for k, q in ((2, 1.960), (3, 2.343), (4, 2.569), (5, 2.728), (10, 3.164)):
    assert ranking.nemenyi_q(k) == pytest.approx(q, abs=1e-3)
  assert ranking.friedman(v[:1])["chi2"] is None   # one block: mean ranks only
  # higher is better flips the ranks
  assert ranking.friedman(-v, lower_is_better=False)["mean_ranks"] == fr["mean_ranks"]
