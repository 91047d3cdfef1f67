"""Synthetic data and independent numpy / scikit-learn references for the detector tests:
class-clustered features (non-negative or signed), a linear head, one class with no fit rows
that is never predicted (the empty-class and never-predicted pitfalls), and the reference
formulas several test files compare against."""
import numpy as np
import scipy.special
from sklearn.covariance import EmpiricalCovariance

from fi_jax import detectors

C, D, N_FIT, N_TEST = 12, 48, 600, 150
EMPTY = C - 1          # no fit row has this label, and it is never predicted


def make_data(signed: bool, seed: int = 0, d: int = D, c: int = C):
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=(c, d)) * 1.5
  y = rng.integers(0, c - 1, N_FIT + N_TEST)           # class c-1 never appears
  h = mu[y] + rng.normal(size=(N_FIT + N_TEST, d))
  if not signed:
    h = np.abs(h)
  h = h.astype(np.float32)
  w = (rng.normal(size=(d, c)) * 0.4).astype(np.float32)
  b = (rng.normal(size=c) * 0.2).astype(np.float32)
  b[c - 1] = -1e4                                       # class c-1 is never predicted
  z = (h.astype(np.float64) @ w + b).astype(np.float32)
  y = y.astype(np.int32)
  y[N_FIT + 3] = -1                                     # an unknown test label is fine
  fit = detectors.Outputs(h[:N_FIT], z[:N_FIT], y[:N_FIT])
  test = detectors.Outputs(h[N_FIT:], z[N_FIT:], y[N_FIT:])
  return fit, test, detectors.Head(w, b)


def f64(x):
  return np.asarray(x, np.float64)


def assert_scores(ours, ref, rtol=1e-4):
  """Relative error <= rtol (scale: max |ref|) and the same ranking where ref has no near-ties."""
  ours, ref = f64(ours), f64(ref)
  assert ours.shape == ref.shape
  assert np.isfinite(ours).all() and np.isfinite(ref).all()
  scale = max(np.abs(ref).max(), 1e-30)
  np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol * 1e-2 * scale)
  order = np.argsort(ref, kind="stable")
  gaps = np.diff(ref[order])
  clear = gaps > 1e-6 * scale
  assert (np.diff(ours[order])[clear] > 0).all(), "ranking differs from the reference"


def fit_score(name, fit, test, head, preset=None, **hp):
  det = detectors.build(name, preset=preset, **hp)
  return np.asarray(det.score(det.fit(fit, head), test))


def softmax(z):
  return np.exp(z - scipy.special.logsumexp(z, axis=1, keepdims=True))


def ref_class_means(fit):
  h, y = f64(fit.features), np.asarray(fit.labels)
  return {c: h[y == c].mean(0) for c in range(C) if (y == c).any()}


def ref_mds(fit, test):
  h, y = f64(fit.features), np.asarray(fit.labels)
  means = ref_class_means(fit)
  centred = np.stack([h[i] - means[y[i]] for i in range(len(y))])
  prec = EmpiricalCovariance(assume_centered=True).fit(centred).precision_
  ht = f64(test.features)
  d = np.stack([np.einsum("nd,de,ne->n", ht - m, prec, ht - m) for m in means.values()], 1)
  return -d.min(1)


def ref_rmds(fit, test):
  bg = EmpiricalCovariance(assume_centered=False).fit(f64(fit.features))
  return ref_mds(fit, test) + bg.mahalanobis(f64(test.features))


def ref_vim_parts(fit, test, head, dim):
  w, b = f64(head.w).T, f64(head.b)                      # W [C, D]
  u = -np.linalg.pinv(w) @ b
  cov = EmpiricalCovariance(assume_centered=True).fit(f64(fit.features) - u).covariance_
  lam, vec = np.linalg.eigh(cov)
  ns = vec[:, np.argsort(lam)[::-1][dim:]]
  res_fit = np.linalg.norm((f64(fit.features) - u) @ ns, axis=1)
  alpha = f64(fit.logits).max(1).mean() / res_fit.mean()
  res = np.linalg.norm((f64(test.features) - u) @ ns, axis=1)
  return res, alpha


def ref_knn(fit, test, k):
  nrm = lambda x: f64(x) / np.linalg.norm(f64(x), axis=1, keepdims=True)
  a, bnk = nrm(test.features), nrm(fit.features)
  d2 = ((a[:, None, :] - bnk[None, :, :]) ** 2).sum(-1)
  return -np.sort(d2, axis=1)[:, k - 1]


def ref_ash(h, pct, mode):
  h = f64(h)
  n = h.shape[1]
  k = n - int(np.round(n * pct / 100.0))
  out = np.zeros_like(h)
  for i, row in enumerate(h):
    keep = np.argsort(-row, kind="stable")[:k]
    s1, s2 = row.sum(), row[keep].sum()
    if mode == "p":
      out[i, keep] = row[keep]
    elif mode == "b":
      out[i, keep] = s1 / k
    elif mode == "s":
      out[i, keep] = row[keep] * np.exp(s1 / s2)
    else:                                                  # scale: unpruned h times exp(s1/s2)
      out[i] = row * np.exp(s1 / s2)
  return out


def energy_np(h, head):
  return scipy.special.logsumexp(f64(h) @ f64(head.w) + f64(head.b), axis=1)


# ----------------------------------------------------------------------------- third wave

def ref_ora(fit, test, head):
  """ORA as the authors' `ora_score` (berkerdemirel/ORA-OOD-Detection-with-Relative-Angles @
  58d0733, util/ood_methods.py), class by class in float64: the angle between h - m and its
  projection onto the boundary between the predicted class and c (both minus m = the mean of
  the class means), over pi; NaN (c = the prediction) -> 0; the max over classes. The class
  means are those of the non-empty fit classes."""
  m = np.mean(list(ref_class_means(fit).values()), 0)
  w = f64(head.w).T                                       # [C, D], as torch's fc.weight
  ht, zt = f64(test.features), f64(test.logits)
  pred, zmax = zt.argmax(1), zt.max(1)
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
  angles = np.zeros((len(ht), w.shape[0]))
  with np.errstate(divide="ignore", invalid="ignore"):
    for c in range(w.shape[0]):
      dw = w[pred] - w[c]
      on_boundary = ht - ((zmax - zt[:, c]) / np.linalg.norm(dw, axis=1) ** 2)[:, None] * dw
      cos = np.sum(unit(ht - m) * unit(on_boundary - m), 1)
      angles[:, c] = np.arccos(cos) / np.pi
  angles[np.isnan(angles)] = 0
  return angles.max(1)


def ref_cfood(fit_features, test_features, k):
  """CFOOD as OpenOOD's `CFOODPostprocessor` (a3eb335), row by row: reference rows
  h / (|h| + 1e-10), each one's sorted squared distances to all reference rows at the grid
  positions + 1, and per test row the first grid kappa where the float32 fraction of reference
  rows whose kappa-distance is >= the test row's distance reaches k; score -kappa."""
  nrm = lambda x: f64(x) / (np.linalg.norm(f64(x), axis=1, keepdims=True) + 1e-10)
  ref, n = nrm(fit_features), len(fit_features)
  kval = np.concatenate((np.linspace(0.001, 0.1, 100), np.linspace(0.105, 0.5, 81),
                         np.linspace(0.51, 0.99, 49)))
  kpos = np.array(kval * n - 1, dtype=int)
  keep = np.concatenate(([True], kpos[:-1] < kpos[1:]))
  kval, kpos = kval[keep], kpos[keep]
  knndst = np.stack([np.sort(np.sum((r - ref) ** 2, 1))[kpos + 1] for r in ref])
  out = []
  for v in nrm(test_features):
    dst = np.sum((v - ref) ** 2, 1)
    count = (knndst >= dst[:, None]).sum(0).astype(np.float32) / np.float32(n)
    pos = np.nonzero(count >= np.float32(k))[0]
    out.append(-(kval[pos[0]] if len(pos) else 1.0))
  return np.asarray(out)


def ref_grood(fit, test):
  """GROOD (OpenOOD grood.py @ 539b805, `_compute_grad_directly` with `use_proto_mean`): the
  noise-prototype gradient p_noise (h - n) / |h - n| of every row, the bank of the correctly
  classified fit rows' gradients in float32 (the faiss index), score = -(squared L2 distance
  to the nearest bank row), exact."""
  means = ref_class_means(fit)
  protos = np.stack(list(means.values()))
  noise = protos.mean(0)

  def grads(h):
    h = f64(h)
    d = np.linalg.norm(h[:, None, :] - protos[None], axis=2)
    diff = h - noise
    dn = np.linalg.norm(diff, axis=1)
    s = np.concatenate([-d, -dn[:, None]], 1)
    p = np.exp(s - scipy.special.logsumexp(s, axis=1, keepdims=True))[:, -1]
    return p[:, None] * diff / np.maximum(dn, 1e-12)[:, None]
  right = np.asarray(fit.labels) == np.asarray(fit.logits).argmax(1)
  bank = grads(fit.features)[right].astype(np.float32).astype(np.float64)
  g = grads(test.features)
  d2 = ((g[:, None, :] - bank[None]) ** 2).sum(-1)
  return -d2.min(1)


# ----------------------------------------------------------------------------- negative labels
# Written from the official code: XueJiang16/NegLabel @ 3253db684075b2db47844676eccdfda40d67a573
# (mmcls/models/classifiers/multi_modal.py CLIPScalableClassifier: mining; mmcls/models/ood/
# clip_ood.py ScalableClassifier.grouping: the score) and MengyuanChen21/NeurIPS2024-CSP @
# 3a7bdabeb89301053ba8bfc56b227b6d81b273e9 (the same files; CSP sets the percentile similarity of
# a candidate whose largest cosine exceeds 0.95 to 1). The official code's word files are read
# in os.listdir order with a dedup dict, and its group permutation is torch.randperm on CUDA;
# here the candidates come as (noun, adjective) lists already deduplicated and the permutation
# is an argument.

def official_neg_mining(noun_emb, adj_emb, pos, neg_topk=0.15, pencentile=0.95, csp=False):
  """The official `text_features_neg` selection: per candidate the `pencentile` quantile of its
  cosines to the ID text features, argsort ascending, the first int(len * neg_topk) nouns and
  adjectives (nouns first)."""
  neg = np.concatenate([noun_emb, adj_emb])
  sims = []
  for i in range(0, len(neg), 1000):                    # emb_batchsize chunks, as the code
    tmp = neg[i:i + 1000] @ pos.T
    sim = np.quantile(tmp, pencentile, axis=-1)        # torch.quantile: linear interpolation
    if csp:
      sim[tmp.max(axis=1) > 0.95] = 1.0
    sims.append(sim)
  sim = np.concatenate(sims)
  n = len(noun_emb)
  ind_noun, ind_adj = np.argsort(sim[:n], kind="stable"), np.argsort(sim[n:], kind="stable")
  return np.concatenate([noun_emb[ind_noun[:int(len(ind_noun) * neg_topk)]],
                         adj_emb[ind_adj[:int(len(ind_adj) * neg_topk)]]])


def official_neg_score(image_features, pos, neg, perm, t=1.0, ngroup=100):
  """ScalableClassifier.forward + grouping: pos_sim = 100 * f @ pos.T, neg_sim = 100 * f @ neg.T;
  the last neg.shape[1] % ngroup columns dropped, columns permuted by `perm`, split into ngroup
  groups; per group the softmax mass of the positives over [pos, group]; the mean over groups.
  ngroup == 1: the softmax mass of the positives over all labels."""
  f = image_features / np.linalg.norm(image_features, axis=-1, keepdims=True)
  pos_sim, neg_sim = 100.0 * f @ pos.T, 100.0 * f @ neg.T
  if ngroup == 1:
    full = scipy.special.softmax(np.concatenate([pos_sim, neg_sim], -1) / t, axis=-1)
    return full[:, :pos.shape[0]].sum(-1)
  drop = neg_sim.shape[1] % ngroup
  if drop > 0:
    neg_sim = neg_sim[:, :-drop]
  negs = neg_sim.T[perm].T.reshape(len(f), ngroup, -1)
  scores = []
  for i in range(ngroup):
    full = scipy.special.softmax(np.concatenate([pos_sim, negs[:, i, :]], -1) / t, axis=-1)
    scores.append(full[:, :pos.shape[0]].sum(-1))
  return np.stack(scores, -1).mean(-1)
