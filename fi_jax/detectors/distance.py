"""Feature-space scores: MDS, RMDS, MDS++, RMDS++, SSD, Residual, ViM, NECO, SHE, cosine,
relative cosine, fDBD, NCI, ORA (docs/detectors.md#feature-space-scores). Statistics are float64 streaming sums (stats.py); linear
algebra (eigh, pinv) and
quadratic forms run in the compute dtype (float64 under x64).

Empty classes (a class with no fit row) are skipped: they are left out of every min / max /
softmax over classes (MDS, RMDS, cosine, relative cosine), and SHE predicts among the classes
that have a pattern. This never produces NaN (the references would: mean of an empty set).
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import (
  Detector,
  Outputs,
  cdtype,
  check_bool,
  check_choice,
  check_number,
  check_seed,
  fc,
  l2_normalize,
  l2_normalize_jit,
  log_max_softmax,
  matmul,
  require,
)


def _peek_classes(train, head) -> tuple[int, object]:
  """(C, the fit set): C from the head if given, else from the first batch's logits (a one-shot
  iterator is re-chained so no batch is lost)."""
  if head is not None:
    return int(np.shape(head.w)[1]), train
  first, train = stats.peek(train)
  if first.logits is None:
    raise ValueError("Pass the head (or fit logits) so that the number of classes is known.")
  return int(np.shape(first.logits)[1]), train


# ----------------------------------------------------------------------------- Mahalanobis

def _gaussian_state(means, valid, cov, prefix=""):
  """Whitened class means: d_c(h) = |h L - mu_c L|^2, L L^T = pinvh(cov)."""
  cd = cdtype()
  lw = stats.whitening(jnp.asarray(cov, cd))
  mp, sqn = _projected_means(jnp.asarray(means, cd), jnp.asarray(valid), lw)
  return {prefix + "proj": lw, prefix + "means": mp, prefix + "sqnorm": sqn}


@jax.jit
def _projected_means(means, valid, lw):
  """(mu_c L, |mu_c L|^2) with the invalid classes' rows 0 and their norms inf (one program,
  not six eager ones)."""
  mp = matmul(means, lw)
  sqn = jnp.where(valid, jnp.sum(mp * mp, -1), jnp.inf)
  return jnp.where(valid[:, None], mp, 0.0), sqn


@jax.jit
def _min_class_maha(h, proj, means, sqnorm):
  return _min_maha(h, {"proj": proj, "means": means, "sqnorm": sqnorm})


def _min_maha(h, state, prefix=""):
  """min_c (h - mu_c)^T P (h - mu_c) via the whitened expansion |a|^2 - 2 a.m_c + |m_c|^2."""
  a = matmul(fc(h), state[prefix + "proj"])
  d = jnp.sum(a * a, -1, keepdims=True) - 2.0 * matmul(a, state[prefix + "means"].T) \
      + state[prefix + "sqnorm"][None, :]
  return jnp.min(d, axis=-1)


class MDS(Detector):
  """Mahalanobis (Lee et al., single layer, no input noise; as OpenOOD/NINCO):
  mu_c = class means of the fit features (true labels), shared covariance
  Sigma = (1/N) sum_i (h_i - mu_{y_i})(h_i - mu_{y_i})^T, P = pinvh(Sigma);
  s = -min_c (h - mu_c)^T P (h - mu_c). Rows with label -1 are ignored."""
  name, needs = "mds", frozenset({"features", "labels"})
  fit_needs = frozenset({"features", "labels"})

  def _class_fit(self, train, head):
    c, train = _peek_classes(train, head)
    st = stats.moments(train, num_classes=c, group="label", scatter=True)
    # one object for MDS and RMDS inside detectors.shared(), so their scores share it too
    return dict(shared.memo((train,), ("class_gaussian", c), lambda: _gaussian_state(
        *stats.class_means(st), stats.within_class_cov(st)))), st

  def _fit(self, train, head):
    return self._class_fit(train, head)[0]

  def _score_args(self, state, outputs):
    """(features, min_c class Mahalanobis distance [N]): shared inside `detectors.shared()` by
    MDS and RMDS, whose class Gaussians are one."""
    return outputs.features, shared.memo((state["proj"], outputs.features), ("min_maha",),
                                         lambda: _min_class_maha(outputs.features, state["proj"],
                                                                 state["means"], state["sqnorm"]))

  def _score(self, state, features, min_class_maha):
    return -min_class_maha


class RMDS(MDS):
  """Relative Mahalanobis (Ren et al.): s = -min_c MD_c(h) + MD_0(h), MD_0 the Mahalanobis
  distance to one Gaussian (global mean and covariance) of the same labelled fit rows."""
  name = "rmds"

  def _fit(self, train, head):
    state, st = self._class_fit(train, head)
    mu0 = (st["sum_grp"] / st["n_grp"])[None, :]
    state.update(_gaussian_state(mu0, np.ones(1, bool), stats.grouped_cov(st), prefix="bg_"))
    return state

  def _score(self, state, features, min_class_maha):
    return -min_class_maha + _min_maha(features, state, prefix="bg_")


class _Normalized:
  """The fit set with L2-normalised feature rows (MDS++ / RMDS++), in the fit set's fixed chunks
  (so the normalisation sees the same shapes however the fit set is batched)."""

  def __init__(self, train):
    self.train = train

  def __iter__(self):
    for _, chunk in stats.chunks(self.train):
      require(chunk.features is not None, "mds_pp / rmds_pp need fit Outputs with features.")
      yield Outputs(_l2n(chunk.features), chunk.logits, chunk.labels)


@jax.jit
def _l2n(h):
  return l2_normalize(fc(h))


def normalized_fit_set(train):
  """The fit set with L2-normalised features; one object per fit set inside
  `detectors.shared()`, so MDS++ and RMDS++ share its class moments."""
  if not stats.is_reiterable(train):
    return _Normalized(train)
  return shared.memo((train,), ("l2_normalized_fit",), lambda: _Normalized(train))


def normalized_features(features):
  """L2-normalised rows (compute dtype), shared inside `detectors.shared()`."""
  return shared.memo((features,), ("l2_normalized",), lambda: _l2n(features))


class MDSpp(MDS):
  """Mahalanobis++ (Mueller & Hein, ICML 2025): MDS on L2-normalised features h / |h| (fit and
  test), class means and shared covariance as MDS."""
  name = "mds_pp"

  def _fit(self, train, head):
    c, train = _peek_classes(train, head)
    return MDS._fit(self, normalized_fit_set(train), head if head is not None else _Classes(c))

  def _score_args(self, state, outputs):
    return MDS._score_args(self, state, Outputs(normalized_features(outputs.features), None))


class RMDSpp(RMDS):
  """RMDS++ (Mueller & Hein, ICML 2025): RMDS on L2-normalised features."""
  name = "rmds_pp"

  def _fit(self, train, head):
    c, train = _peek_classes(train, head)
    return RMDS._fit(self, normalized_fit_set(train), head if head is not None else _Classes(c))

  def _score_args(self, state, outputs):
    return MDSpp._score_args(self, state, outputs)


class _Classes:
  """A stand-in head that only carries the number of classes (for `_peek_classes`)."""

  def __init__(self, c: int):
    self.w = np.zeros((0, c))


def _global_cov(st) -> np.ndarray:
  """(1/N) sum_i (h_i - mu)(h_i - mu)^T over all rows, mu their mean (float64)."""
  d = st["sum"] / st["n"] - st["shift"]
  return st["scatter"] / st["n"] - np.outer(d, d)


class SSD(Detector):
  """SSD-style single Gaussian (Sehwag et al., label-free form on a classifier's features; as
  OpenOOD's `ssd` postprocessor with one class, no input noise): mu = mean of all fit
  features, Sigma = (1/N) sum_i (h_i - mu)(h_i - mu)^T, P = pinvh(Sigma);
  s = -(h - mu)^T P (h - mu). Labels are not used."""
  name, needs = "ssd", frozenset({"features"})
  fit_needs = frozenset({"features"})

  def _fit(self, train, head):
    st = stats.moments(train, scatter=True)
    return _gaussian_state((st["sum"] / st["n"])[None, :], np.ones(1, bool), _global_cov(st))

  def _score(self, state, features, logits):
    return -_min_maha(features, state)


# ----------------------------------------------------------------------------- ViM / Residual

def vim_dim(d: int) -> int:
  """ViM paper / NINCO principal dimension: 1000 if D >= 2048, 512 if D >= 768, else D // 2."""
  return 1000 if d >= 2048 else 512 if d >= 768 else d // 2


@jax.jit
def _residual_norm(h, u, q):
  return jnp.linalg.norm(matmul(fc(h) - u, q), axis=-1)


@jax.jit
def _origin(w, b):
  """u = -pinv(W) b (W = w^T) in the compute dtype (one compilation)."""
  cd = cdtype()
  return -matmul(jnp.linalg.pinv(jnp.asarray(w, cd).T), jnp.asarray(b, cd))


@jax.jit
def _sym_eigh(cov):
  """Eigenvectors of the symmetrised matrix, by ascending eigenvalue."""
  return jnp.linalg.eigh(0.5 * (cov + cov.T))[1]


def _centre_eigh(train, head):
  """(u = -pinv(W) b, eigenvectors of Sigma_u by ascending eigenvalue)."""
  u = _origin(head.w, head.b)
  # the plain scatter pass about the data's mean (shared with MDS, SSD, NECO), moved to u
  st = stats.moments(train, scatter=True)
  cov = jnp.asarray(stats.second_moment(st, np.asarray(u, np.float64)), cdtype())
  return u, _sym_eigh(cov)


class Residual(Detector):
  """-|Q^T (h - u)| (ViM's baseline): u = -pinv(W) b (W = w^T, [C, D]), Q = eigenvectors of the
  D - dim smallest eigenvalues of Sigma_u = (1/N) sum_i (h_i - u)(h_i - u)^T (second moment
  about u, eigh in float64). dim=None: ViM rule (1000 if D >= 2048, 512 if D >= 768, else
  D // 2; ViM paper and NINCO); OpenOOD: 512. dim >= D is an error (empty residual space)."""
  name, needs = "residual", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"dim": None, "max_rows": 50_000, "seed": 0}
  presets = {"ninco": {"dim": None}, "openood": {"dim": 512}}

  @classmethod
  def validate(cls, hp):
    check_number(cls.name, hp, "dim", lo=1, integer=True, none_ok=True)
    check_number(cls.name, hp, "max_rows", lo=1, integer=True)
    check_seed(cls.name, hp)

  def _dim(self, d: int) -> int:
    dim = vim_dim(d) if self.hparams["dim"] is None else int(self.hparams["dim"])
    if dim >= d:
      raise ValueError(f"{self.name}: dim={dim} >= feature dimension {d} leaves an empty residual "
                       f"space (docs/detectors.md#residual); set dim < {d}.")
    return dim

  def _subspace(self, train, head):
    d = int(np.shape(head.w)[0])
    dim = self._dim(d)
    # u and the eigenvectors do not depend on dim: one pinv and one eigh for residual and vim
    # in both presets inside detectors.shared()
    u, vecs = shared.memo((train, head), ("residual_eigh",), lambda: _centre_eigh(train, head))
    return u, vecs[:, :d - dim]

  def _fit(self, train, head):
    u, q = self._subspace(train, head)
    return {"u": u, "q": q}

  def _score(self, state, features, logits):
    return -_residual_norm(features, state["u"], state["q"])


class ViM(Residual):
  """Virtual logit matching (Wang et al.): s = LSE(z) - alpha |Q^T (h - u)|, u, Q as Residual,
  alpha = mean_i max_c z_ic / mean_i |Q^T (h_i - u)| over the fit rows (their logits). alpha
  takes a second pass over a re-iterable fit set (Outputs, list, ...); from a one-shot iterator
  it uses a seeded uniform subset of `max_rows` rows kept during the first pass (exact when the
  set is smaller). dim: ViM rule for None (paper, NINCO), 256 for OpenOOD
  (docs/detectors.md#vim)."""
  name, needs = "vim", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features", "logits"})
  presets = {"ninco": {"dim": None}, "openood": {"dim": 256}}

  def _fit(self, train, head):
    if stats.is_reiterable(train):
      u, q = self._subspace(train, head)
      src = train
    else:
      sample = stats.RowSample(self.hparams["max_rows"], self.hparams["seed"],
                               ("features", "logits"))
      train = _tee(train, sample)
      u, q = self._subspace(train, head)
      s = sample.result()
      src = Outputs(s["features"], s["logits"])
    tot_logit, tot_norm, n = 0.0, 0.0, 0
    for _, chunk in stats.chunks(src):
      require(chunk.logits is not None, "vim needs fit Outputs with logits.")
      tot_logit += float(jnp.sum(jnp.max(fc(chunk.logits), -1)))
      tot_norm += float(jnp.sum(_residual_norm(chunk.features, u, q)))
      n += stats.num_rows(chunk)
    if not tot_norm > 0:
      # every fit row lies in the principal subspace: alpha = mean max-logit / 0 is undefined
      # (the reference gives inf or NaN); 0 makes the score the energy (docs/detectors.md#vim)
      logging.warning("%s: every fit row has a zero residual norm; alpha = 0 (the score is "
                      "the energy LSE(z)).", self.name)
      return {"u": u, "q": q, "alpha": jnp.asarray(0.0, cdtype())}
    return {"u": u, "q": q, "alpha": jnp.asarray(tot_logit / tot_norm, cdtype())}

  def _score(self, state, features, logits):
    return (jax.nn.logsumexp(fc(logits), -1)
            - state["alpha"] * _residual_norm(features, state["u"], state["q"]))


def _tee(train, sample: stats.RowSample):
  """Yields the fit set's fixed chunks while feeding them to `sample`."""
  for start, chunk in stats.chunks(train):
    sample.add(start, chunk)
    yield chunk


# ----------------------------------------------------------------------------- NECO

@jax.jit
def _neco_ratio(h, mean, inv_std, pcs):
  s = (fc(h) - mean) * inv_std
  return jnp.linalg.norm(matmul(s, pcs), axis=-1) / jnp.linalg.norm(s, axis=-1)


@functools.partial(jax.jit, static_argnames=("dim",))
def _principal_directions(zcov, *, dim: int):
  """The `dim` leading eigenvectors of the symmetrised zcov, largest eigenvalue first."""
  _, vecs = jnp.linalg.eigh(0.5 * (zcov + zcov.T))               # ascending eigenvalues
  return vecs[:, ::-1][:, :dim]


class NECO(Detector):
  """NECO (Ammar et al. ICLR 2024; official code): standardise with the fit set's mean and
  population std (sklearn StandardScaler: a zero std is replaced by 1), s = (h - mu) / sigma;
  P_d = the top-`dim` principal directions of the standardised fit features (eigh of their
  covariance, float64); score = |P_d^T s| / |s|, times max_c z_c when `maxlogit` (the official
  code's ViT / Swin / DeiT form; False: its ResNet form). dim = 100 (official ImageNet
  default); dim > D is an error."""
  name, needs = "neco", frozenset({"features", "logits"})
  fit_needs = frozenset({"features"})
  defaults = {"dim": 100, "maxlogit": True}
  score_only = frozenset({"maxlogit"})

  @classmethod
  def validate(cls, hp):
    require(isinstance(hp["dim"], (int, np.integer)) and hp["dim"] >= 1,
            "neco: dim must be an int >= 1.")
    require(isinstance(hp["maxlogit"], (bool, np.bool_)), "neco: maxlogit must be a bool.")

  def _fit(self, train, head):
    st = stats.moments(train, scatter=True)
    d = len(st["sum"])
    if self.hparams["dim"] > d:
      raise ValueError(f"neco: dim={self.hparams['dim']} > feature dimension {d}; set dim <= {d}.")
    cov = _global_cov(st)
    std = np.sqrt(np.maximum(np.diag(cov), 0.0))
    std = np.where(std == 0.0, 1.0, std)          # sklearn's StandardScaler keeps such columns
    cd = cdtype()
    pcs = _principal_directions(jnp.asarray(cov / np.outer(std, std), cd),
                                dim=int(self.hparams["dim"]))
    return {"mean": jnp.asarray(st["sum"] / st["n"], cd), "inv_std": jnp.asarray(1.0 / std, cd),
            "pcs": pcs}

  def _score(self, state, features, logits):
    r = _neco_ratio(features, state["mean"], state["inv_std"], state["pcs"])
    return r * jnp.max(fc(logits), -1) if self.hparams["maxlogit"] else r


# ----------------------------------------------------------------------------- class means

@jax.jit
def _cosines(features, unit_means):
  return matmul(l2_normalize(fc(features)), unit_means.T)


class Cosine(Detector):
  """NINCO 'cosine': max_c cos(h, mu_c), mu_c the (uncentred) class means of the fit features
  (true labels); empty classes are skipped."""
  name, needs = "cosine", frozenset({"features", "labels"})
  fit_needs = frozenset({"features", "labels"})

  def _fit(self, train, head):
    c, train = _peek_classes(train, head)
    st = stats.moments(train, num_classes=c, group="label")
    means, valid = stats.class_means(st)
    cd = cdtype()
    return {"means": l2_normalize_jit(jnp.asarray(means, cd)), "valid": jnp.asarray(valid)}

  def _score_args(self, state, outputs):
    """(None, cosines [N, C]): shared inside `detectors.shared()` by cosine and relative
    cosine, whose fits are one."""
    return None, shared.memo((state["means"], outputs.features), ("cosines",),
                             lambda: _cosines(outputs.features, state["means"]))

  def _score(self, state, features, cos):
    return jnp.max(jnp.where(state["valid"][None, :], cos, -jnp.inf), -1)


class RelativeCosine(Cosine):
  """NINCO 'mcm' on class means: max_c softmax_c(cos(h, mu_c) / T) over the non-empty classes,
  returned as its log (float64). T = 1."""
  name = "relative_cosine"
  defaults = {"temperature": 1.0}
  fit_family, score_only = Cosine, frozenset({"temperature"})

  @classmethod
  def validate(cls, hp):
    check_number("relative_cosine", hp, "temperature", lo=0, lo_open=True)

  def _score(self, state, features, cos):
    z = cos / self.hparams["temperature"]
    return log_max_softmax(jnp.where(state["valid"][None, :], z, -jnp.inf))


class SHE(Detector):
  """Simplified Hopfield energy (Zhang et al.): pattern m_k = mean fit feature over rows with
  label k that are also predicted k; s = <h, m_yhat> (OpenOOD 'inner_product'), or
  -|h - m_yhat| ('euclidean') or cos(h, m_yhat) ('cosine'). yhat = argmax of the logits over
  the classes that have a pattern (a class without a correctly classified fit row is skipped)."""
  name, needs = "she", frozenset({"features", "logits", "labels"})
  fit_needs = frozenset({"features", "logits", "labels"})
  defaults = {"metric": "inner_product"}

  @classmethod
  def validate(cls, hp):
    check_choice("she", hp, "metric", ("inner_product", "euclidean", "cosine"))

  def _fit(self, train, head):
    c, train = _peek_classes(train, head)
    st = stats.moments(train, num_classes=c, group="correct")
    means, valid = stats.class_means(st)
    return {"patterns": jnp.asarray(means, cdtype()), "valid": jnp.asarray(valid)}

  def _score(self, state, features, logits):
    z = jnp.where(state["valid"][None, :], fc(logits), -jnp.inf)
    m = state["patterns"][jnp.argmax(z, -1)]
    h = fc(features)
    if self.hparams["metric"] == "inner_product":
      return jnp.sum(h * m, -1)
    if self.hparams["metric"] == "euclidean":
      return -jnp.linalg.norm(h - m, axis=-1)
    return jnp.sum(l2_normalize(h) * l2_normalize(m), -1)


# ----------------------------------------------------------------------------- boundary

def _over_norm(num, x):
  """num / |x| (rows of x), and 0 where |x| == 0 (x exactly at the normalising point: the
  references' 0/0 = NaN or x/0 = inf; docs/detectors.md#fdbd). The guard tests the squared
  norm, so that the sqrt keeps its single use and XLA compiles num / sqrt(.) exactly as the
  unguarded num / norm (bit-identical scores)."""
  sq = jnp.sum(x * x, axis=-1)
  return jnp.where(sq > 0, num / jnp.sqrt(sq), 0.0)


@jax.jit
def _inverse_class_distances(w):
  """1 / |w_c - w_c'| for every class pair [C, C] (compute dtype); 0 on the diagonal and for
  identical weight vectors (e.g. a zero-initialised head: no decision boundary, so the pair's
  term is 0 instead of 0/0 or x/0; docs/detectors.md#fdbd)."""
  w = jnp.asarray(w, cdtype())
  sq = jnp.sum(w * w, 0)
  d2 = sq[:, None] + sq[None, :] - 2.0 * matmul(w.T, w)
  dist = jnp.sqrt(jnp.maximum(d2, 0.0))
  dist = jnp.where(jnp.eye(dist.shape[0], dtype=bool), 1.0, dist)
  return jnp.where(dist > 0, 1.0 / dist, 0.0)


class FDBD(Detector):
  """fDBD (Liu & Qin): [sum_{c != yhat} (z_yhat - z_c) / |w_yhat - w_c|] / |h - mu| with mu
  the mean fit feature (distance_as_normalizer=True, OpenOOD default) or / |h| (False).
  z = the given logits (bias included); |w_i - w_j| from the head, float64."""
  name, needs = "fdbd", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"distance_as_normalizer": True}

  @classmethod
  def validate(cls, hp):
    check_bool("fdbd", hp, "distance_as_normalizer")

  def _fit(self, train, head):
    cd = cdtype()
    out = {"inv_dist": _inverse_class_distances(head.w)}
    if self.hparams["distance_as_normalizer"]:
      st = stats.moments(train)
      out["mean"] = jnp.asarray(st["sum"] / st["n"], cd)
    return out

  def _score(self, state, features, logits):
    z = fc(logits)
    pred = jnp.argmax(z, -1)
    zmax = jnp.max(z, -1, keepdims=True)
    num = jnp.sum((zmax - z) * state["inv_dist"][pred], -1)
    h = fc(features)
    if self.hparams["distance_as_normalizer"]:
      h = h - state["mean"]
    return _over_norm(num, h)


class NCI(Detector):
  """NCI: <w_yhat, h - mu> / |h - mu| + alpha |h|_1, mu the mean fit feature, yhat = argmax z."""
  name, needs = "nci", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"alpha": 1e-4}

  @classmethod
  def validate(cls, hp):
    check_number("nci", hp, "alpha", lo=0)

  def _fit(self, train, head):
    st = stats.moments(train)
    cd = cdtype()
    return {"w": jnp.asarray(head.w, cd), "mean": jnp.asarray(st["sum"] / st["n"], cd)}

  def _score(self, state, features, logits):
    h = fc(features)
    wy = state["w"].T[jnp.argmax(fc(logits), -1)]
    c = h - state["mean"]
    l1 = self.hparams["alpha"] * jnp.sum(jnp.abs(h), -1)
    # h == mu exactly: 0/0 (NaN in the reference) -> the cosine term is 0 (docs/detectors.md#nci).
    # The guard selects after the sum and does not read the norm, so that XLA compiles the sum
    # exactly as without it (bit-identical scores).
    return jnp.where(jnp.any(c != 0, -1),
                     jnp.sum(wy * c, -1) / jnp.linalg.norm(c, axis=-1) + l1, l1)



# ----------------------------------------------------------------------------- ORA

@jax.jit
def _gram_columns(w):
  """W^T W [C, C] of the head's weights (compute dtype)."""
  w = jnp.asarray(w, cdtype())
  return matmul(w.T, w)


class ORA(Detector):
  """ORA, OOD detection with relative angles (Demirel et al., NeurIPS 2025; authors' code
  berkerdemirel/ORA-OOD-Detection-with-Relative-Angles@58d0733283c73a291d254696d6a4084b84a78f97
  util/ood_methods.py `ora_score`, OpenOOD PR #311 `ORAPostprocessor`). With m the mean of the
  class means of the fit features (true labels), yhat = argmax z and, for every class c, the
  projection of h onto the decision boundary between yhat and c,
      h_c = h - (z_yhat - z_c) / |w_yhat - w_c|^2 (w_yhat - w_c),
  the angle theta_c = arccos(cos(h - m, h_c - m)) / pi and s = max_c theta_c (the official
  aggregation; no hyper-parameter). A class whose angle is undefined (c = yhat, or
  w_c = w_yhat: 0/0) counts as 0, as the official code's NaN -> 0. Empty fit classes are
  left out of m (the official mean over all C class means would be NaN). Everything in the
  compute dtype; the cosine is clipped to [-1, 1] (the official float32 arccos of a rounded
  cosine above 1 is NaN -> 0, an angle within rounding of 0 either way)."""
  name, needs = "ora", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features", "labels"})

  def _fit(self, train, head):
    c, train = _peek_classes(train, head)
    st = stats.moments(train, num_classes=c, group="label")
    means, valid = stats.class_means(st)
    cd = cdtype()
    centre = np.asarray(means, np.float64)[valid].mean(0)
    return {"w": jnp.asarray(head.w, cd), "gram": _gram_columns(head.w),
            "centre": jnp.asarray(centre, cd)}

  def _score(self, state, features, logits):
    z = fc(logits)
    pred = jnp.argmax(z, -1)
    dz = jnp.max(z, -1, keepdims=True) - z                          # z_yhat - z_c >= 0
    g = state["gram"]
    gp = g[pred]                                                    # w_yhat . w_c  [N, C]
    dw2 = jnp.diagonal(g)[pred][:, None] + jnp.diagonal(g)[None, :] - 2.0 * gp
    u = fc(features) - state["centre"]
    uw = matmul(u, state["w"])                                      # u . w_c
    udw = jnp.take_along_axis(uw, pred[:, None], -1) - uw           # u . (w_yhat - w_c)
    ok = dw2 > 0
    t = jnp.where(ok, dz / jnp.where(ok, dw2, 1.0), 0.0)
    uu = jnp.sum(u * u, -1, keepdims=True)
    dot = uu - t * udw                                              # u . (u - t dw)
    vv = jnp.maximum(uu - 2.0 * t * udw + t * t * dw2, 0.0)         # |u - t dw|^2
    den = jnp.maximum(jnp.sqrt(uu), 1e-12) * jnp.maximum(jnp.sqrt(vv), 1e-12)
    # max_c arccos(cos_c) = arccos(min_c cos_c) (arccos decreases): one arccos per row, not
    # one per class; the angles are >= 0, so the undefined ones' 0 wins only where all are
    cos = jnp.min(jnp.where(ok, jnp.clip(dot / den, -1.0, 1.0), 1.0), -1)
    return jnp.where(jnp.any(ok, -1), jnp.arccos(cos) / jnp.pi, 0.0)
