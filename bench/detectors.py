"""Benchmark: the whole fi_jax.detectors suite (both presets) vs numpy / scikit-learn / faiss-cpu.

    python bench/detectors.py                 # 100k x 768 fit features, 1000 classes, 50k test
    python bench/detectors.py --scale 0.1     # 10k fit / 5k test (same D and C)
    python bench/detectors.py --quick         # a 2-core host: 4096 fit / 2048 test rows, ...

Synthetic class-clustered non-negative features and a linear head. For every detector and
preset ('ninco', 'openood') it times fi_jax fit + score (wall clock, compilation included,
float64 under x64 like the pipeline) and an independent vectorised numpy / scikit-learn
reference of the same formula (KNN / NNGuide: faiss-cpu exact IndexFlatL2 / IndexFlatIP on the
same bank and k), and prints times, the ratio reference / fi_jax and the max relative error.
Every registered detector that reads only features, logits, labels and the head is in the suite
(`--detectors a,b` selects some); ODIN and AdaSCALE need a model and images and are not.
TempScale, ReAct, WeiPer+KLD (...) keep their defaults (at most max_rows = 50,000 seeded fit
rows); their references use the same rows (WeiPer / WeiPer+KLD in their `precision`: float32
perturbed logits, MSPs and bin edges as the official code, then float64 KL sums).

Part 1a times the suite as the pipeline runs it (on JAX arrays, copied to the device once a
run and timed, as `fi_jax.pipeline.outputs_of` hands every set to the detectors; inside
`detectors.shared()`: work repeated on the same arrays is done once, e.g. one KNN search serves
k=1000 and k=50), without the
pairwise-kernel detectors (Relation, WeiPer+KLD, WeiPer: a test x fit-bank or test x r C
kernel), against one faiss-cpu exact search on the bank (target (a): <= 2.5x; `--warm` adds a
second, compiled run; `--warm --rounds N` makes that N compiled runs, each alternated with the
search at the largest k, and compares their medians: the host's speed drifts). Part 1b times
each pairwise-kernel detector alone (fit + score, cold and compiled) against its arithmetic
floor: the same matrix products as bare `jnp.dot` calls in the
dtype and blocks the detector uses (inputs prepared outside the timing), timed in the same run
(target (b): <= 1.5x compiled). Part 2 times every run alone and checks it against its
reference (and that it equals part 1's scores); target KNN >= 1.0x faiss-cpu; the third-wave
detectors (ora, cfood, grood) >= 1x their references. Then the zero-shot section below
(`--no-zero-shot` leaves it out; `--no-reference` stops after part 1).
The bench unsets OPENBLAS_CORETYPE (`--coretype NAME` sets it: faiss-cpu's OpenBLAS falls back to
its slow generic Prescott kernel on a CPU it does not recognise) before numpy loads OpenBLAS, and
prints the kernels in use and the host's load average.

    python bench/detectors.py --zero-shot     # NegLabel, CSP, GL-MCM vs their numpy references

`--zero-shot` times the two-tower detectors alone instead (they read a text bank / a local
column the synthetic classifier has not): unit embeddings E=512 (CLIP B/16), C=1000 ID labels, a
bank of 90,228 words x bank-scale (the shipped list's size) with 14,448 x bank-scale
adjectives, 50k test images x scale; fit + score against the numpy re-implementation of the
official code (tests/helpers/detector_reference.py: mining in blocks of 1000, the score one
softmax per group).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fi_jax.run import huge_pages  # noqa: E402

huge_pages.reexec()   # as the CLI: malloc on huge pages (restarts the bench once, before any work)

# numpy's and faiss's OpenBLAS read this when they load: unset, they pick the CPU's own kernel
# (--coretype NAME sets it instead, for an OpenBLAS that does not recognise the CPU)
_CORETYPE_GIVEN = os.environ.pop("OPENBLAS_CORETYPE", None)
if "--coretype" in sys.argv[:-1]:
  os.environ["OPENBLAS_CORETYPE"] = sys.argv[sys.argv.index("--coretype") + 1]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402
from jax import lax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import faiss  # noqa: E402
import scipy.optimize  # noqa: E402
import scipy.special  # noqa: E402
import scipy.stats  # noqa: E402
from sklearn.covariance import EmpiricalCovariance  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from fi_jax import detectors  # noqa: E402
from fi_jax.detectors import stats  # noqa: E402

# what a detector may read here: Outputs and the head (no images, no layers)
FEATURE_LOGIT = frozenset({"features", "logits", "labels", "head"})
# detectors whose cost is a test x (fit bank or r C perturbed classes) kernel: timed against
# the arithmetic floor of their products (part 1b), not inside the suite's faiss target
PAIRWISE = ("relation", "weiper_kld", "weiper")


# ----------------------------------------------------------------------------- data

def make_data(n_fit, n_test, d, c, seed=0):
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=(c, d)).astype(np.float32)
  w = (mu.T / np.linalg.norm(mu, axis=1) * 4.0
       + 0.05 * rng.normal(size=(d, c))).astype(np.float32)
  b = (0.1 * rng.normal(size=c)).astype(np.float32)
  y = rng.integers(0, c, n_fit + n_test).astype(np.int32)
  h = np.empty((n_fit + n_test, d), np.float32)
  for i in range(0, len(y), 20000):          # in slices: bounded temporaries
    sl = slice(i, i + 20000)
    h[sl] = np.abs(0.6 * mu[y[sl]] + rng.normal(size=(len(y[sl]), d)).astype(np.float32))
  z = (h @ w + b).astype(np.float32)
  fit = detectors.Outputs(h[:n_fit], z[:n_fit], y[:n_fit])
  test = detectors.Outputs(h[n_fit:], z[n_fit:], y[n_fit:])
  return fit, test, detectors.Head(w, b)


# ----------------------------------------------------------------------------- references

def _lse(z):
  return scipy.special.logsumexp(z, axis=1)


def _log_msp(z):
  return z.max(1) - _lse(z)


def _norm(x):
  x = np.asarray(x, np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _class_means(h, y, c):
  cnt = np.bincount(y, minlength=c).astype(np.float64)
  s = np.zeros((c, h.shape[1]))
  np.add.at(s, y, h)
  return s / np.maximum(cnt, 1)[:, None], cnt > 0


def _maha_min(ht, means, valid, prec):
  a = ht @ prec
  d = (a * ht).sum(1)[:, None] - 2 * a @ means.T + ((means @ prec) * means).sum(1)[None]
  return np.where(valid[None], d, np.inf).min(1)


def _ash(h, pct, mode):
  n = h.shape[1]
  k = n - int(np.round(n * pct / 100.0))
  idx = np.argpartition(-h, k - 1, axis=1)[:, :k]
  kept = np.take_along_axis(h, idx, 1)
  s1, s2 = h.sum(1), kept.sum(1)
  out = np.zeros_like(h)
  if mode == "p":
    np.put_along_axis(out, idx, kept, 1)
  elif mode == "b":
    np.put_along_axis(out, idx, np.repeat((s1 / k)[:, None], k, 1), 1)
  elif mode == "s":
    np.put_along_axis(out, idx, kept * np.exp(s1 / s2)[:, None], 1)
  else:
    out = h * np.exp(s1 / s2)[:, None]
  return out


def _sample_rows(fit, hp):
  """The fit rows fi_jax's TempScale / ReAct use: all, or its seeded max_rows subset."""
  smp = stats.RowSample(hp["max_rows"], hp["seed"], ())
  for start, chunk in stats.chunks(fit):
    smp.add(start, chunk)
  return smp.result()["rows"]


def _weiper_msp(z, r, c):
  zr = z.reshape(len(z), r, c)
  if z.dtype == np.float32:   # the official code: softmax(z_r).max() in float32
    e = np.exp(zr - zr.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).max(-1).mean(-1)
  return np.exp(zr.max(-1) - scipy.special.logsumexp(zr, axis=-1)).mean(-1)


def _official_edges(lo, hi, nbins, dtype):
  """[lo, hi + 1e-8] in nbins equal bins: np.linspace in float64, or for float32 the official
  code's torch linspace (lo + fl32(i / nbins) (fl32(hi + 1e-8) - lo), in float32)."""
  if dtype != np.float32:
    return np.linspace(lo, hi + 1e-8, nbins + 1)
  f = np.float32
  lo, stop = f(lo), f(f(hi) + f(1e-8))
  return lo + np.arange(nbins + 1, dtype=f) / f(nbins) * (stop - lo)


def _density(x, lo, hi, nbins):
  """Per row: the fraction of its entries in each of nbins equal bins of [lo, hi + 1e-8) (the
  edges in x's dtype, as _official_edges)."""
  edges = _official_edges(lo, hi, nbins, x.dtype)
  idx = np.searchsorted(edges, x, side="right") - 1
  ok = (x >= edges[0]) & (x < edges[-1])
  rows = np.repeat(np.arange(len(x)), x.shape[1]).reshape(x.shape)
  flat = np.bincount((rows * nbins + np.clip(idx, 0, nbins - 1))[ok], minlength=len(x) * nbins)
  return flat.reshape(len(x), nbins) / x.shape[1]


def _sym_kl(p, q, size, eps):
  """KL(p'||q') + KL(q'||p'): p' = normalised p + eps, q' = normalised moving average of q over
  `size` bins (edges repeated) + eps."""
  left = (size - 1) // 2
  n = q.shape[1]
  padded = q[:, np.clip(np.arange(-left, n - left + size - 1), 0, n - 1)]
  cs = np.concatenate([np.zeros((len(q), 1)), np.cumsum(padded, 1)], 1)
  q_ = (cs[:, size:size + n] - cs[:, :n]) / size + eps
  q_ = q_ / q_.sum(1, keepdims=True)
  p_ = (p + eps) / (p + eps).sum()
  return (p_ * np.log(p_ / q_)).sum(1) + (q_ * np.log(q_ / p_)).sum(1)


def _weiper_kld(fit, hp, ht, wt, bt, msp):
  """WeiPer+KLD on the seeded fit rows fi_jax uses; perturbed logits in blocks of 512 rows, in
  wt's dtype (float32: the official code's arithmetic up to the KLs, summed in float64)."""
  hf = np.asarray(fit.features, wt.dtype)[_sample_rows(fit, hp)]
  blocks = lambda h: (h[i:i + 512] @ wt + bt for i in range(0, len(h), 512))
  zlo = min(z.min() for z in blocks(hf))
  zhi = max(z.max() for z in blocks(hf))
  nb = hp["n_bins"]
  pf_h = _density(hf, hf.min(), hf.max(), nb).mean(0)
  pf_z = np.concatenate([_density(z, zlo, zhi, nb) for z in blocks(hf)]).mean(0)
  kl_h = _sym_kl(pf_h, _density(ht, hf.min(), hf.max(), nb), hp["smoothing"], hp["epsilon"])
  kl_z = np.concatenate([_sym_kl(pf_z, _density(z, zlo, zhi, nb), hp["smoothing_perturbed"],
                                 hp["epsilon_noise"]) for z in blocks(ht)])
  return -(kl_h + hp["lambda_1"] * kl_z - hp["lambda_2"] * msp)


def _libmr_fit_high(tail):
  """libMR 0.1.9 MR.fit_high's (scale, shape): x0 = normalised log(tail + 1 - min); libMR's
  likelihood equation in the Gumbel scale, bracketed as libMR does, solved by scipy's Brent
  with libMR's stopping tolerance (xtol 4e-6)."""
  x = np.log(tail + 1.0 - tail.min())
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
  return np.exp(rng * mu + x.max()), 1.0 / (rng * sig)


def faiss_knn(fit, test, k):
  """Squared L2 distances [N, k] of the unit test rows to their k nearest unit fit rows by
  faiss-cpu's exact IndexFlatL2 (normalisation, add and search): the search target (a) is
  measured against, and KNN's reference."""
  index = faiss.IndexFlatL2(fit.features.shape[1])
  index.add(_norm(fit.features))
  return index.search(_norm(test.features), k)[0]


def reference(name, hp, fit, test, head):
  """Scores of an independent numpy / sklearn / faiss implementation (float64 unless noted)."""
  if name == "knn":         # before the float64 copies below, which faiss does not read
    return -faiss_knn(fit, test, hp["k"])[:, -1].astype(np.float64)
  hf, zf, yf = (np.asarray(fit.features, np.float64), np.asarray(fit.logits, np.float64),
                np.asarray(fit.labels))
  ht, zt = np.asarray(test.features, np.float64), np.asarray(test.logits, np.float64)
  w, b = np.asarray(head.w, np.float64), np.asarray(head.b, np.float64)
  c = w.shape[1]
  energy_of = lambda h: _lse(h @ w + b)
  if name == "msp":
    return _log_msp(zt)
  if name == "maxlogit":
    return zt.max(1)
  if name == "energy":
    return hp["temperature"] * _lse(zt / hp["temperature"])
  if name == "tempscale":
    rows = _sample_rows(fit, hp)
    zf, yf = zf[rows], yf[rows]
    nll = lambda t: np.mean(_lse(zf / t) - zf[np.arange(len(yf)), yf] / t)
    t = scipy.optimize.minimize_scalar(nll, bounds=(hp["t_min"], hp["t_max"]), method="bounded",
                                       options={"xatol": 1e-8}).x
    return _log_msp(zt / t)
  if name == "gen":
    p = np.exp(zt - _lse(zt)[:, None])
    top = -np.sort(-p, axis=1)[:, :hp["top_m"]]
    return -np.sum(top ** hp["gamma"] * (1 - top) ** hp["gamma"], 1)
  if name == "klm":
    pf = np.exp(zf - _lse(zf)[:, None])
    pred = zf.argmax(1)
    d, ok = _class_means(pf, pred, c)
    d[~ok] = np.eye(c)[~ok]
    if hp["variant"] == "openood":
      d = d / d.sum(1, keepdims=True)
    p = np.exp(zt - _lse(zt)[:, None])
    with np.errstate(divide="ignore"):
      logd = np.log(d)
    zero = d <= 0
    kl = (np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(1)[:, None]
          - p @ np.where(zero, 0, logd).T)
    kl = np.where(p @ zero.T.astype(float) > 0, np.inf, kl)
    return -kl.min(1)
  if name == "react":
    clip = np.percentile(np.asarray(fit.features)[_sample_rows(fit, hp)].reshape(-1),
                         hp["percentile"])
    return energy_of(np.minimum(ht, clip))
  if name in ("ash_p", "ash_b", "ash_s", "scale"):
    return energy_of(_ash(ht, hp["percentile"], {"ash_p": "p", "ash_b": "b", "ash_s": "s",
                                                 "scale": "scale"}[name]))
  if name == "dice":
    contrib = w * hf.mean(0)[:, None]
    wm = np.where(contrib > np.percentile(contrib, hp["percentile"]), w, 0)
    return _lse(ht @ wm + b)
  if name in ("mds", "rmds"):
    means, valid = _class_means(hf, yf, c)
    prec = EmpiricalCovariance(assume_centered=True).fit(hf - means[yf]).precision_
    s = -_maha_min(ht, means, valid, prec)
    if name == "rmds":
      bg = EmpiricalCovariance(assume_centered=False).fit(hf)
      s = s + bg.mahalanobis(ht)
    return s
  if name in ("vim", "residual"):
    dim = hp["dim"] if hp["dim"] is not None else detectors.distance.vim_dim(hf.shape[1])
    u = -np.linalg.pinv(w.T) @ b
    cov = EmpiricalCovariance(assume_centered=True).fit(hf - u).covariance_
    lam, vec = np.linalg.eigh(cov)
    ns = vec[:, np.argsort(lam)[::-1][dim:]]
    res = np.linalg.norm((ht - u) @ ns, axis=1)
    if name == "residual":
      return -res
    alpha = zf.max(1).mean() / np.linalg.norm((hf - u) @ ns, axis=1).mean()
    return _lse(zt) - alpha * res
  if name == "combood":
    index = faiss.IndexFlatL2(hf.shape[1])
    index.add(_norm(fit.features))
    dist, _ = index.search(_norm(test.features), hp["k"])
    nrm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    scaler = StandardScaler().fit(nrm(hf))
    zfit, ztest = scaler.transform(nrm(hf)), scaler.transform(nrm(ht))
    inv = np.linalg.inv(np.cov(zfit, rowvar=False) + hp["reg"] * np.identity(hf.shape[1]))
    return (-np.sqrt(hf.shape[1]) * np.log(dist[:, -1].astype(np.float64))
            - ((ztest @ inv) * ztest).sum(1))
  if name == "nnguide":
    keep = np.concatenate([stats.bernoulli_mask(hp["seed"], s, len(ch.features), hp["alpha"])
                           for s, ch in stats.chunks(fit)])
    guides = (_norm(fit.features[keep]) * _lse(zf[keep])[:, None]).astype(np.float32)
    index = faiss.IndexFlatIP(hf.shape[1])
    index.add(guides)
    sims, _ = index.search(_norm(test.features), min(hp["k"], len(guides)))
    return _lse(zt) * sims.astype(np.float64).mean(1)
  if name == "fdbd":
    sq = (w * w).sum(0)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * w.T @ w, 0))
    np.fill_diagonal(dist, 1.0)
    pred = zt.argmax(1)
    num = ((zt.max(1)[:, None] - zt) / dist[pred]).sum(1)
    den = ht - hf.mean(0) if hp["distance_as_normalizer"] else ht
    return num / np.linalg.norm(den, axis=1)
  if name == "nci":
    cc = ht - hf.mean(0)
    wy = w.T[zt.argmax(1)]
    return (wy * cc).sum(1) / np.linalg.norm(cc, axis=1) + hp["alpha"] * np.abs(ht).sum(1)
  if name == "ora":
    means, valid = _class_means(hf, yf, c)
    u = ht - means[valid].mean(0)
    pred = zt.argmax(1)
    t = np.empty_like(zt)
    for i in range(0, len(zt), 4096):          # in row blocks: bounded [rows, C] temporaries
      sl = slice(i, i + 4096)
      dw = w[:, pred[sl]].T @ w                                   # w_yhat . w_c
      dw2 = (w * w).sum(0)[pred[sl]][:, None] + (w * w).sum(0)[None] - 2 * dw
      uw = u[sl] @ w
      udw = uw[np.arange(len(uw)), pred[sl]][:, None] - uw
      with np.errstate(divide="ignore", invalid="ignore"):
        tt = (zt[sl].max(1)[:, None] - zt[sl]) / dw2
        uu = (u[sl] * u[sl]).sum(1)[:, None]
        cos = (uu - tt * udw) / (np.sqrt(uu) * np.sqrt(uu - 2 * tt * udw + tt * tt * dw2))
        ang = np.arccos(np.clip(cos, -1, 1)) / np.pi
      t[sl] = np.where(dw2 > 0, ang, 0.0)
    return t.max(1)
  if name == "cfood":
    keep = np.concatenate([stats.bernoulli_mask(hp["seed"], s, len(ch.features), hp["alpha"])
                           for s, ch in stats.chunks(fit)]) if hp["alpha"] < 1 else slice(None)
    unit = lambda x: x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-10)
    ref = unit(hf[keep])
    n, sq = len(ref), (ref * ref).sum(1)
    kval, kpos = detectors.knn.cfood_grid(n)
    rho = np.empty((len(kpos), n))
    for i in range(0, n, 512):
      d = (ref[i:i + 512] ** 2).sum(1)[:, None] + sq[None] - 2 * ref[i:i + 512] @ ref.T
      rho[:, i:i + 512] = np.sort(d, axis=1)[:, kpos + 1].T
    need = detectors.knn.cfood_count_threshold(n, hp["k"])
    v = unit(ht)
    out = np.empty(len(v))
    for i in range(0, len(v), 256):
      d = (v[i:i + 256] ** 2).sum(1)[:, None] + sq[None] - 2 * v[i:i + 256] @ ref.T
      lo, hi = np.zeros(len(d), int), np.full(len(d), len(kval))
      while (lo < hi).any():                  # smallest grid index with enough neighbourhoods
        mid = (lo + hi) // 2
        ok = (lo < hi) & ((rho[np.minimum(mid, len(kval) - 1)] >= d).sum(1) >= need)
        lo, hi = np.where((lo < hi) & ~ok, mid + 1, lo), np.where(ok, mid, hi)
      out[i:i + 256] = -np.where(lo < len(kval), kval[np.minimum(lo, len(kval) - 1)], 1.0)
    return out
  if name == "grood":
    means, valid = _class_means(hf, yf, c)
    protos, noise = means[valid], means[valid].mean(0)

    def grads(h):
      g = np.empty_like(h)
      for i in range(0, len(h), 4096):
        x = h[i:i + 4096]
        dc = np.sqrt(np.maximum((x * x).sum(1)[:, None] + (protos * protos).sum(1)[None]
                                - 2 * x @ protos.T, 0))
        diff = x - noise
        dn = np.linalg.norm(diff, axis=1)
        s = np.concatenate([-dc, -dn[:, None]], 1)
        p = np.exp(-dn - _lse(s))
        g[i:i + 4096] = (p / np.maximum(dn, 1e-12))[:, None] * diff
      return g
    bank = grads(hf)[yf == zf.argmax(1)].astype(np.float32)
    index = faiss.IndexFlatL2(hf.shape[1])
    index.add(bank)
    g = grads(ht)
    _, idx = index.search(g.astype(np.float32), 1)
    return -((g - bank[idx[:, 0]].astype(np.float64)) ** 2).sum(1)
  if name == "gradnorm":
    p = np.exp(zt - _lse(zt)[:, None])
    return np.abs(ht).sum(1) * np.abs(c * p - 1).sum(1)
  if name in ("cosine", "relative_cosine"):
    means, valid = _class_means(hf, yf, c)
    cos = _norm(ht).astype(np.float64) @ (means / np.linalg.norm(means, axis=1, keepdims=True)).T
    if name == "cosine":
      return np.where(valid[None], cos, -np.inf).max(1)
    return _log_msp(np.where(valid[None], cos / hp["temperature"], -np.inf))
  if name == "she":
    pred = zf.argmax(1)
    ok = pred == yf
    pats, valid = _class_means(hf[ok], yf[ok], c)
    yhat = np.where(valid[None], zt, -np.inf).argmax(1)
    return (ht * pats[yhat]).sum(1)
  if name == "mcm":
    t = w / np.linalg.norm(w, axis=0, keepdims=True)
    return _log_msp(_norm(ht).astype(np.float64) @ t / hp["temperature"])
  if name == "bats":
    lo = hf.mean(0) - hp["lam"] * hf.std(0)
    return energy_of(np.clip(ht, lo, hf.mean(0) + hp["lam"] * hf.std(0)))
  if name == "optfs":
    rows = _sample_rows(fit, hp)
    hs, ps = hf[rows], zf[rows].argmax(1)
    q0, q1 = np.quantile(hs, 1e-3), np.quantile(hs, 1 - 1e-3)
    width = (q1 - q0) / 100.0
    left = np.arange(q0, q1, width)
    binned = lambda x: np.where(x < left[np.maximum(np.searchsorted(left, x, "right") - 1, 0)]
                                + width, np.searchsorted(left, x, "right") - 1, -1)
    bf = binned(hs)
    lc = (w.T[ps] * hs)[bf >= 0]
    contrib = np.bincount(bf[bf >= 0], lc, len(left)) / len(hs)
    theta = contrib / np.linalg.norm(contrib) * 1000
    bt = binned(ht)
    shaped = np.where(bt >= 0, theta[np.maximum(bt, 0)], 0) * ht
    return energy_of(shaped) if hp["score"] == "energy" else (w.T[zt.argmax(1)] * shaped).sum(1)
  if name == "line":
    means, _ = _class_means(hf, yf, c)
    contrib = means * w.T
    tw = np.array([np.percentile(np.abs(contrib[k])[:, None] * w, hp["p_w"]) for k in range(c)])
    ma = contrib > np.percentile(contrib, hp["p_a"], axis=1)[:, None]
    clip = hp["clip"] or np.percentile(np.asarray(fit.features)[_sample_rows(fit, hp)],
                                       hp["clip_percentile"])
    x = np.minimum(ht, clip)
    pred = (x @ w + b).argmax(1)
    out = np.empty((len(x), c))
    for k in np.unique(pred):                 # one masked W per predicted class
      sel = pred == k
      out[sel] = (x[sel] * ma[k]) @ np.where(np.abs(contrib[k])[:, None] * w > tw[k], w, 0) + b
    return _lse(out)
  if name in ("weiper", "weiper_kld"):
    from fi_jax.detectors import weiper as weiper_lib  # the same seeded draw of W~
    dt = np.float32 if hp["precision"] == "float32" else np.float64
    wt, bt = (x.astype(dt) for x in weiper_lib.perturbed_head(
        w, b, repeats=hp["repeats"], delta=hp["delta"], seed=hp["seed"]))
    ht = ht.astype(dt)
    msp = np.concatenate([_weiper_msp(ht[i:i + 512] @ wt + bt, hp["repeats"], c)
                          for i in range(0, len(ht), 512)])
    if name == "weiper":
      return np.log(msp)
    return _weiper_kld(fit, hp, ht, wt, bt, msp)
  if name in ("mds_pp", "rmds_pp"):
    nf = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    hn, htn = nf(hf), nf(ht)
    means, valid = _class_means(hn, yf, c)
    prec = EmpiricalCovariance(assume_centered=True).fit(hn - means[yf]).precision_
    s = -_maha_min(htn, means, valid, prec)
    if name == "rmds_pp":
      s = s + EmpiricalCovariance(assume_centered=False).fit(hn).mahalanobis(htn)
    return s
  if name == "ssd":
    return -EmpiricalCovariance(assume_centered=False).fit(hf).mahalanobis(ht)
  if name == "neco":
    mu, sd = hf.mean(0), hf.std(0)
    sd[sd == 0] = 1.0
    lam, vec = np.linalg.eigh(np.cov((hf - mu) / sd, rowvar=False, bias=True))
    s = (ht - mu) / sd
    r = np.linalg.norm(s @ vec[:, ::-1][:, :hp["dim"]], axis=1) / np.linalg.norm(s, axis=1)
    return r * zt.max(1) if hp["maxlogit"] else r
  if name == "relation":
    nrm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)          # float64 throughout
    fb, pb = nrm(hf), np.exp(zf - _lse(zf)[:, None])
    fq, pq = nrm(ht), np.exp(zt - _lse(zt)[:, None])
    out = np.zeros(len(fq))
    for i in range(0, len(fq), 256):
      r = np.maximum(fq[i:i + 256] @ fb.T, 0) * (pq[i:i + 256] @ pb.T)
      out[i:i + 256] = np.where(r > hp["thres"], r ** hp["pow"], 0).sum(1)
    return out
  if name == "openmax":
    ok = zf.argmax(1) == yf
    mav, _ = _class_means(zf[ok], yf[ok], c)
    d = np.linalg.norm(zf[ok] - mav[yf[ok]], axis=1)
    scale, shape, small, fitted = np.ones(c), np.ones(c), np.zeros(c), np.zeros(c, bool)
    for k in range(c):
      tail = np.sort(d[yf[ok] == k])[-hp["tail"]:]
      if len(tail) >= 2 and tail[-1] > tail[0]:                 # else no Weibull: w = 0
        small[k], fitted[k] = tail[0], True
        scale[k], shape[k] = _libmr_fit_high(tail)
    dt = np.sqrt(np.maximum((zt ** 2).sum(1)[:, None] - 2 * zt @ mav.T + (mav ** 2).sum(1), 0))
    x = np.maximum(dt + 1 - small, 0)
    w = np.where(fitted, 1 - np.exp(-(x / scale) ** shape), 0.0)
    a = hp["alpha"]
    top = np.argsort(-zt, axis=1)[:, :a]
    omega = np.zeros_like(zt)
    np.put_along_axis(omega, top, (a - np.arange(a)) / a, 1)
    v = zt * (1 - w * omega)
    v0 = (zt * w * omega).sum(1)
    m = np.maximum(v.max(1), v0)
    e0 = np.exp(v0 - m)
    return -e0 / (np.exp(v - m[:, None]).sum(1) + e0)
  if name == "vra":
    lo, hi = np.percentile(np.asarray(fit.features)[_sample_rows(fit, hp)].reshape(-1),
                           [hp["percentile_low"], hp["percentile_high"]])
    g = (np.clip(ht, lo, hi) if hp["mode"] == "clip"
         else np.where(ht < lo, 0, np.minimum(ht, hi)))
    return energy_of(g)
  raise ValueError(f"no reference for {name}")


# ----------------------------------------------------------------------------- floors

@functools.partial(jax.jit, static_argnames=("block",))
def _rows_times(x, w, *, block):
  """sum_j (x_b @ w)_ij per row, over row blocks of `block` rows: the bare product of a WeiPer
  pass ([block, D] x [D, r C] jnp.dot calls in w's dtype), reduced so it is not dead code."""
  n = x.shape[0]
  pad = (-n) % block
  xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, block, x.shape[1])
  return lax.map(lambda xb: jnp.dot(xb, w, precision=lax.Precision.HIGHEST).sum(-1), xs)


@functools.partial(jax.jit, static_argnames=("qb", "bb"))
def _pair_times(f, p, bank, pbank, *, qb, bb):
  """Relation's two float32 kernels f_q . f_j and p_q . p_j as bare jnp.dot calls in its
  [query_block, bank_block] blocks (summed per query row so they are not dead code)."""
  n, nbank = f.shape[0], bank.shape[0]
  pad = (-n) % qb
  fs = jnp.pad(f, ((0, pad), (0, 0))).reshape(-1, qb, f.shape[1])
  ps = jnp.pad(p, ((0, pad), (0, 0))).reshape(-1, qb, p.shape[1])

  def one(args):
    fq, pq = args

    def block(i, acc):
      start = jnp.minimum(i * bb, nbank - bb)
      fb = lax.dynamic_slice_in_dim(bank, start, bb, axis=0)
      pb = lax.dynamic_slice_in_dim(pbank, start, bb, axis=0)
      return (acc + jnp.dot(fq, fb.T, precision=lax.Precision.HIGHEST).sum(-1)
              + jnp.dot(pq, pb.T, precision=lax.Precision.HIGHEST).sum(-1))
    return lax.fori_loop(0, -(-nbank // bb), block, jnp.zeros((qb,), jnp.float32))
  return lax.map(one, (fs, ps))


def floor_passes(name, hp, fit, test, head):
  """[(what, thunk)]: the matrix products detector `name` computes, as bare jnp.dot calls in
  the dtype and blocks it uses (inputs prepared outside the timing)."""
  if name == "relation":
    sm = lambda z: scipy.special.softmax(np.asarray(z, np.float64), axis=1).astype(np.float32)
    f, bank = (jnp.asarray(_norm(x.features)) for x in (test, fit))
    p, pbank = jnp.asarray(sm(test.logits)), jnp.asarray(sm(fit.logits))
    qb, bb = min(hp["query_block"], len(f)), min(hp["bank_block"], len(bank))
    return [(f"2 float32 kernels [{len(f)} x {len(bank)}] (D={f.shape[1]}, C={p.shape[1]})",
             lambda: _pair_times(f, p, bank, pbank, qb=qb, bb=bb))]
  from fi_jax.detectors import weiper as weiper_lib
  dt = jnp.float32 if hp["precision"] == "float32" else jnp.float64
  wt32, _ = weiper_lib.perturbed_head(head.w, head.b, repeats=hp["repeats"], delta=hp["delta"],
                                      seed=hp["seed"])
  w = jnp.asarray(wt32).astype(dt)
  dtn = jnp.dtype(dt).name
  ht = jnp.asarray(test.features).astype(dt)
  passes = [(f"score [{len(ht)} x {w.shape[1]}] {dtn}",
             lambda: _rows_times(ht, w, block=min(hp["block_rows"], len(ht))))]
  if name == "weiper_kld":   # the fit: the extremes of z~, then the histograms (two passes)
    hf = np.asarray(fit.features)[_sample_rows(fit, hp)]
    blk = min(weiper_lib.FIT_BLOCK_ROWS, len(hf))
    if dt == jnp.float32:
      first = (jnp.asarray(hf), w)
    else:     # float64: a float32 pass bounds the extremes (+ reruns of a few blocks)
      first = (jnp.asarray(hf).astype(jnp.float32), jnp.asarray(wt32))
    second = jnp.asarray(hf).astype(dt)
    passes += [(f"fit extremes [{len(hf)} x {w.shape[1]}] {first[0].dtype.name}",
                lambda: _rows_times(*first, block=blk)),
               (f"fit histograms [{len(hf)} x {w.shape[1]}] {dtn}",
                lambda: _rows_times(second, w, block=blk))]
  return passes


# ----------------------------------------------------------------------------- timing

def timed(fn):
  t = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return out, time.perf_counter() - t


def rel_err(a, r):
  a, r = np.asarray(a, np.float64), np.asarray(r, np.float64)
  ok = np.isfinite(r)
  return float(np.abs(a[ok] - r[ok]).max() / max(np.abs(r[ok]).max(), 1e-30))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--scale", type=float, default=1.0, help="fraction of 100k fit / 50k test rows")
  ap.add_argument("--dim", type=int, default=768)
  ap.add_argument("--classes", type=int, default=1000)
  ap.add_argument("--detectors", default="", help="comma-separated subset (default: all)")
  ap.add_argument("--no-reference", action="store_true",
                  help="time the fi_jax suite only (no standalone runs, no references)")
  ap.add_argument("--zero-shot", action="store_true",
                  help="time NegLabel, CSP and GL-MCM against their numpy references instead")
  ap.add_argument("--no-zero-shot", action="store_true",
                  help="leave out the zero-shot section after part 2")
  ap.add_argument("--bank-scale", type=float, default=1.0,
                  help="fraction of the zero-shot bank's 90,228 labels (and 14,448 adjectives)")
  ap.add_argument("--warm", action="store_true",
                  help="part 1a: run the suite a second time, compiled (compilation excluded)")
  ap.add_argument("--rounds", type=int, default=1,
                  help="with --warm: compiled suite runs, each alternated with a faiss search "
                  "at the largest k; (a) uses the medians (default 1)")
  ap.add_argument("--coretype", default=None,
                  help="set OPENBLAS_CORETYPE (e.g. SkylakeX) when an OpenBLAS falls back to Prescott")
  ap.add_argument("--quick", action="store_true",
                  help="a 2-core host's scale: --scale 0.04096 (4096 fit / 2048 test rows) "
                  "--bank-scale 0.25 --warm")
  args = ap.parse_args()
  if args.rounds < 1:
    ap.error(f"--rounds {args.rounds}: give 1 or more")
  if args.quick:
    args.scale, args.bank_scale, args.warm = 0.04096, 0.25, True
  n_fit, n_test = int(100_000 * args.scale), int(50_000 * args.scale)
  t0 = time.perf_counter()
  fit, test, head = make_data(n_fit, n_test, args.dim, args.classes)
  blas = sorted({f"{os.path.basename(i['filepath']).split('-')[0]}: {i.get('architecture')}"
                 for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"})
  print(f"BLAS kernels: {blas} (OPENBLAS_CORETYPE {args.coretype or 'unset'} by the bench; it "
        f"was {_CORETYPE_GIVEN!r}); host load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs; malloc on huge pages: "
        f"{'yes' if huge_pages.in_use() else 'no'} (GLIBC_TUNABLES="
        f"{os.environ.get('GLIBC_TUNABLES', '')!r}; FI_JAX_HUGE_PAGES=0 turns it off)")
  if any(b.endswith("Prescott") for b in blas):
    print("  warning: an OpenBLAS fell back to its generic Prescott kernel (it did not recognise "
          "the CPU): the BLAS-bound references (faiss) run slowly; give --coretype with the "
          "CPU's kernel (e.g. SkylakeX, Haswell) for a fair comparison")
  print(f"data: fit {fit.features.shape}, test {test.features.shape}, C={args.classes} "
        f"({time.perf_counter() - t0:.1f} s); jax {jax.__version__} on {jax.devices()[0].platform}"
        f" x{jax.device_count()}, faiss {faiss.__version__} ({faiss.omp_get_max_threads()} threads)"
        f"; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")

  # score blocks as the pipeline sets them for a run's largest set (detectors pad every set
  # to a multiple of the block: SCORE_BLOCK rows, or the next power of two when fewer)
  with detectors.scoring_rows(n_test):
    run_bench(args, ap, t0, fit, test, head, n_fit, n_test)


def on_device(out):
  """out's arrays as JAX arrays, as the pipeline hands every set to the detectors
  (`fi_jax.pipeline.outputs_of`): one host-to-device copy a run, not one per detector."""
  arr = lambda x: None if x is None else jnp.asarray(x)
  return detectors.Outputs(arr(out.features), arr(out.logits), arr(out.labels))


def run_bench(args, ap, t0, fit, test, head, n_fit, n_test):
  if args.zero_shot:
    zero_shot_bench(args, t0)
    print(f"wall time of the whole bench: {time.perf_counter() - t0:.0f} s")
    return
  names = args.detectors.split(",") if args.detectors else [
      n for n in detectors.names() if detectors.REGISTRY[n].needs <= FEATURE_LOGIT
      and detectors.REGISTRY[n].text_bank is None]
  unknown = [n for n in names if n not in detectors.REGISTRY]
  other = [n for n in names if n in detectors.REGISTRY
           and not detectors.REGISTRY[n].needs <= FEATURE_LOGIT]
  if unknown or other:
    ap.error(f"--detectors: unknown {unknown}, not feature/logit detectors {other}; valid: "
             f"{[n for n in detectors.names() if detectors.REGISTRY[n].needs <= FEATURE_LOGIT]}")
  runs = [(name, preset) for name in names for preset in ("ninco", "openood")]
  dets = {r: detectors.build(r[0], preset=r[1]) for r in runs}
  suite_runs = [r for r in runs if r[0] not in PAIRWISE]
  pair_runs = [r for r in runs if r[0] in PAIRWISE]

  # 1a. the suite as the pipeline runs it, without the pairwise-kernel detectors: every
  #     detector x preset, fit + score, one detectors.shared() scope (shared class moments, one
  #     KNN search for both k, identical preset pairs computed once)
  suite_scores = {}

  def run_suite(label, table=True):
    if table:
      print(f"\n1a. suite without {', '.join(PAIRWISE)}: every detector x preset inside "
            f"detectors.shared() (fit + score, {label})\n{'detector':16s} {'preset':8s} "
            f"{'fit s':>8s} {'score s':>8s}")
    t = time.perf_counter()
    fit_d, test_d = on_device(fit), on_device(test)     # timed: once a run, as the pipeline
    with detectors.shared([dets[r] for r in suite_runs]):
      for name, preset in suite_runs:
        det = dets[(name, preset)]
        state, t_fit = timed(lambda: det.fit(fit_d, head))
        suite_scores[(name, preset)], t_score = timed(lambda: det.score(state, test_d))
        if table:
          print(f"{name:16s} {preset:8s} {t_fit:8.2f} {t_score:8.2f}", flush=True)
    return time.perf_counter() - t
  t_suite = run_suite("compilation included")
  same = sum(1 for r in suite_runs if detectors.hparams_of(*r) in
             [detectors.hparams_of(*q) for q in suite_runs if q[0] == r[0] and q < r])
  print(f"suite total: {t_suite:.1f} s ({len(suite_runs)} detector x preset runs; {same} have "
        f"the hyper-parameters of another preset of the same detector)")
  knn_ks = sorted({dets[r].hparams["k"] for r in suite_runs if r[0] == "knn"}) or [1000]
  search = lambda k: timed(lambda: faiss_knn(fit, test, k))[1]
  warm, faiss_rounds = [], []
  if args.warm and suite_runs:
    # compiled runs alternated with the largest-k search (the host's speed drifts by tens of
    # percent within minutes: a ratio of two lone timings taken minutes apart is mostly drift)
    for i in range(args.rounds):
      steps = [("suite", lambda i=i: run_suite("compiled: the second run", table=i == 0)),
               ("faiss", lambda: search(knn_ks[-1]))]
      for what, fn in (steps if i % 2 == 0 else steps[::-1]):
        (warm if what == "suite" else faiss_rounds).append(fn())
  faiss_s = {k: search(k) for k in knn_ks[:-1]}
  faiss_s[knn_ks[-1]] = float(np.median(faiss_rounds)) if faiss_rounds else search(knn_ks[-1])
  print(f"\n(a) suite without the pairwise-kernel detectors / one faiss-cpu exact search "
        f"(IndexFlatL2 on the unit rows: normalise, add and search the {n_fit} x {args.dim} "
        f"bank with {n_test} queries) [target <= 2.5]")
  for k, t_f in faiss_s.items():
    t_w = f"; compiled {np.median(warm):.1f} s: {np.median(warm) / t_f:.2f}" if warm else ""
    print(f"  k={k}: faiss {t_f:.1f} s; suite {t_suite:.1f} s: {t_suite / t_f:.2f}{t_w}")
  if len(warm) > 1:
    ratios = [w / f for w, f in zip(warm, faiss_rounds)]
    print(f"  {len(warm)} rounds, compiled suite and k={knn_ks[-1]} search alternated (the "
          f"medians above): suite s {', '.join(f'{w:.1f}' for w in warm)}; faiss s "
          f"{', '.join(f'{f:.1f}' for f in faiss_rounds)}; per round "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (median {np.median(ratios):.2f})")

  # 1b. each pairwise-kernel detector alone (fit + score, no sharing) against the bare products
  #     it computes, timed in this run: cold (compilation included) and compiled
  print(f"\n1b. pairwise-kernel detectors alone vs their arithmetic floor (the same products as "
        f"bare jnp.dot calls, same dtype and blocks) [target <= 1.5 compiled]\n"
        f"{'detector':12s} {'preset(s)':14s} {'precision':9s} {'fit s':>7s} {'score s':>8s} "
        f"{'cold s':>7s} {'compiled':>8s} {'floor s':>8s} {'cold/fl':>7s} {'comp/fl':>7s}  floor")
  done = {}
  fit_d, test_d = on_device(fit), on_device(test)       # the detectors' inputs (parts 1b, 2)
  for name, preset in pair_runs:
    det = dets[(name, preset)]
    key = (name, tuple(sorted(det.hparams.items())))
    if key in done:
      suite_scores[(name, preset)] = done[key]
      continue
    presets = "/".join(p for n, p in pair_runs if n == name and
                       tuple(sorted(dets[(n, p)].hparams.items())) == key[1])
    state, t_fit = timed(lambda: det.fit(fit_d, head))
    scores, t_score = timed(lambda: det.score(state, test_d))
    state, t_fit2 = timed(lambda: det.fit(fit_d, head))
    _, t_score2 = timed(lambda: det.score(state, test_d))
    done[key] = suite_scores[(name, preset)] = scores
    passes = floor_passes(name, det.hparams, fit, test, head)
    for _, fn in passes:
      timed(fn)                                       # compile
    t_floor = sum(timed(fn)[1] for _, fn in passes)
    cold, comp = t_fit + t_score, t_fit2 + t_score2
    prec = det.hparams.get("precision", "float32")
    print(f"{name:12s} {presets:14s} {prec:9s} {t_fit2:7.2f} {t_score2:8.2f} {cold:7.2f} "
          f"{comp:8.2f} {t_floor:8.2f} {cold / t_floor:7.2f} {comp / t_floor:7.2f}  "
          f"{' + '.join(w for w, _ in passes)}", flush=True)
  if args.no_reference:
    print(f"wall time of the whole bench: {time.perf_counter() - t0:.0f} s")
    return

  # 2. each detector x preset alone (no sharing) against its reference
  print(f"\n2. each run alone vs the reference\n{'detector':16s} {'preset':8s} {'fit s':>8s} "
        f"{'score s':>8s} {'fi_jax s':>9s} {'ref s':>8s} {'ref/fi':>7s} {'max rel err':>11s}")
  rows, ref_cache, alone_total, faiss_times = [], {}, 0.0, {}
  for (name, preset), det in dets.items():
    state, t_fit = timed(lambda: det.fit(fit_d, head))
    scores, t_score = timed(lambda: det.score(state, test_d))
    np.testing.assert_array_equal(np.asarray(scores), np.asarray(suite_scores[(name, preset)]))
    t_ours = t_fit + t_score
    alone_total += t_ours
    key = (name, tuple(sorted(det.hparams.items())))
    if key in ref_cache:
      ref, t_ref = ref_cache[key]
    else:
      ref, t_ref = timed(lambda: reference(name, det.hparams, fit, test, head))
      ref_cache[key] = (ref, t_ref)
      if name == "knn":
        faiss_times[det.hparams["k"]] = (t_ref, t_ours)
    err = rel_err(scores, ref)
    rows.append((name, preset, t_fit, t_score, t_ours, t_ref, err))
    print(f"{name:16s} {preset:8s} {t_fit:8.2f} {t_score:8.2f} {t_ours:9.2f} {t_ref:8.2f} "
          f"{t_ref / t_ours:7.2f} {err:11.2e}", flush=True)

  print(f"\nsuite without the pairwise-kernel detectors (shared, as run): {t_suite:.1f} s; "
        f"all runs one by one: {alone_total:.1f} s; their references: "
        f"{sum(t for _, t in ref_cache.values()):.1f} s (each distinct configuration once)")
  for k, (t_f, ours) in sorted(faiss_times.items()):
    print(f"KNN k={k} alone: fi_jax {ours:.1f} s (fit + score) vs faiss-cpu exact search "
          f"{t_f:.1f} s (IndexFlatL2 add + search): {t_f / ours:.2f}x faiss [target >= 1.0x]")
  new = [r for r in rows if r[0] in ("ora", "cfood", "grood")]
  if new:
    print("third-wave post-hoc detectors vs their numpy references [target >= 1x]: " + ", ".join(
        f"{n} ({p}) {t_ref / t:.2f}x" for n, p, _, _, t, t_ref, _ in new))
  if not args.no_zero_shot and not args.detectors:
    zero_shot_bench(args, t0)
  print(f"wall time of the whole bench: {time.perf_counter() - t0:.0f} s")


def zero_shot_bench(args, t0):
  """NegLabel / CSP / GL-MCM fit + score vs the numpy re-implementation of the official code."""
  from fi_jax.data import wordnet_labels
  from tests.helpers import detector_reference as dref
  rng = np.random.default_rng(0)
  e, c, n = 512, args.classes, int(50_000 * args.scale)
  m, n_adj = int(90_228 * args.bank_scale), int(14_448 * args.bank_scale)

  def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
  pos = unit(rng.normal(size=(c, e)))
  codes = {v: k for k, v in wordnet_labels.LEXFILES.items()}
  lex = np.full(m, codes["noun.artifact"], np.int32)
  lex[m - n_adj:] = codes["adj.all"]
  bank_emb = unit(rng.normal(size=(m, e)) + 0.5 * pos[rng.integers(0, c, m)])
  img = unit(rng.normal(size=(n, e)) + pos[rng.integers(0, c, n)])
  print(f"zero-shot: E={e}, C={c}, bank {m} labels ({n_adj} adjectives), {n} test images "
        f"({time.perf_counter() - t0:.1f} s)\n{'detector':10s} {'fit s':>7s} {'score s':>8s} "
        f"{'fi_jax s':>9s} {'ref s':>8s} {'ref/fi':>7s} {'max rel err':>11s}")
  for name in (args.detectors.split(",") if args.detectors else ("neglabel", "csp", "glmcm")):
    bank = {f"{name}/emb": bank_emb, f"{name}/lexfile": lex,
            f"{name}/word": np.arange(m, dtype=np.int32), f"{name}/pos": pos}
    head = detectors.Head(pos.T.copy(), np.zeros(c, np.float32), bank)
    det = detectors.build(name, exclude="") if name != "glmcm" else detectors.build(name)
    extras = None
    if name == "glmcm":   # the local column as the extraction step gives it: log max softmax
      z = img @ pos.T + 0.1 * rng.normal(size=(n, c))
      extras = {"layer/local/mcm": (z.max(1) - scipy.special.logsumexp(z, 1)).astype(np.float32)}
    test = detectors.Outputs(img, None, extras=extras)
    state, t_fit = timed(lambda: det.fit(None, head))
    scores, t_score = timed(lambda: det.score(state, test))

    def ref():   # the positives as the detector normalises them (near-tied candidates: see docs)
      p64 = pos.astype(np.float64)
      p64 /= np.linalg.norm(p64, axis=1, keepdims=True)
      if name == "glmcm":
        g = scipy.special.softmax(img.astype(np.float64) @ p64.T, -1).max(-1)
        return g + np.exp(extras["layer/local/mcm"].astype(np.float64))
      neg = dref.official_neg_mining(bank_emb[:m - n_adj].astype(np.float64),
                                     bank_emb[m - n_adj:].astype(np.float64), p64,
                                     csp=name == "csp")
      k = len(neg) - len(neg) % 100
      return dref.official_neg_score(img.astype(np.float64), p64, neg,
                                     np.random.default_rng(0).permutation(k))
    want, t_ref = timed(ref)
    t_ours = t_fit + t_score
    print(f"{name:10s} {t_fit:7.2f} {t_score:8.2f} {t_ours:9.2f} {t_ref:8.2f} "
          f"{t_ref / t_ours:7.2f} {rel_err(scores, want):11.2e}", flush=True)


if __name__ == "__main__":
  main()
