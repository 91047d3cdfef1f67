"""Feature-space scores: MDS, RMDS, Residual, ViM, SHE, cosine, relative cosine, fDBD, NCI
(docs/detectors.md#feature-space-scores). Statistics are float64 streaming sums (stats.py); linear
algebra (eigh, pinv) and
quadratic forms run in the compute dtype (float64 under x64).

Empty classes (a class with no fit row) are skipped: they are left out of every min / max /
softmax over classes (MDS, RMDS, cosine, relative cosine), and SHE predicts among the classes
that have a pattern. This never produces NaN (the references would: mean of an empty set).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import (Detector, Outputs, cdtype, fc, l2_normalize, log_max_softmax,
                                   matmul, require)


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
  mp = matmul(jnp.asarray(means, cd), lw)
  sqn = jnp.where(jnp.asarray(valid), jnp.sum(mp * mp, -1), jnp.inf)
  mp = jnp.where(jnp.asarray(valid)[:, None], mp, 0.0)
  return {prefix + "proj": lw, prefix + "means": mp, prefix + "sqnorm": sqn}


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


# ----------------------------------------------------------------------------- ViM / Residual

def vim_dim(d: int) -> int:
  """ViM paper / NINCO principal dimension: 1000 if D >= 2048, 512 if D >= 768, else D // 2."""
  return 1000 if d >= 2048 else 512 if d >= 768 else d // 2


@jax.jit
def _residual_norm(h, u, q):
  return jnp.linalg.norm(matmul(fc(h) - u, q), axis=-1)


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
    require(hp["dim"] is None or int(hp["dim"]) >= 0, f"{cls.name}: dim must be >= 0 or None.")

  def _dim(self, d: int) -> int:
    dim = vim_dim(d) if self.hparams["dim"] is None else int(self.hparams["dim"])
    if dim >= d:
      raise ValueError(f"{self.name}: dim={dim} >= feature dimension {d} leaves an empty residual "
                       f"space (docs/detectors.md#residual); set dim < {d}.")
    return dim

  def _subspace(self, train, head):
    cd = cdtype()
    w = jnp.asarray(head.w, cd)
    u = -matmul(jnp.linalg.pinv(w.T), jnp.asarray(head.b, cd))
    dim = self._dim(int(w.shape[0]))
    st = stats.moments(train, scatter=True, shift=np.asarray(u, np.float64))
    cov = jnp.asarray(st["scatter"] / st["n"], cd)
    _, vecs = jnp.linalg.eigh(0.5 * (cov + cov.T))        # ascending eigenvalues
    return u, vecs[:, :w.shape[0] - dim]

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
    return {"u": u, "q": q, "alpha": jnp.asarray(tot_logit / tot_norm, cdtype())}

  def _score(self, state, features, logits):
    return (jax.nn.logsumexp(fc(logits), -1)
            - state["alpha"] * _residual_norm(features, state["u"], state["q"]))


def _tee(train, sample: stats.RowSample):
  """Yields the fit set's fixed chunks while feeding them to `sample`."""
  for start, chunk in stats.chunks(train):
    sample.add(start, chunk)
    yield chunk


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
    return {"means": l2_normalize(jnp.asarray(means, cd)), "valid": jnp.asarray(valid)}

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
    require(hp["temperature"] > 0, "relative_cosine: temperature must be > 0.")

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
    require(hp["metric"] in ("inner_product", "euclidean", "cosine"),
            "she: metric must be 'inner_product', 'euclidean' or 'cosine'.")

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

class FDBD(Detector):
  """fDBD (Liu & Qin): [sum_{c != yhat} (z_yhat - z_c) / |w_yhat - w_c|] / |h - mu| with mu
  the mean fit feature (distance_as_normalizer=True, OpenOOD default) or / |h| (False).
  z = the given logits (bias included); |w_i - w_j| from the head, float64."""
  name, needs = "fdbd", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"distance_as_normalizer": True}

  @classmethod
  def validate(cls, hp):
    require(isinstance(hp["distance_as_normalizer"], (bool, np.bool_)),
            "fdbd: distance_as_normalizer must be a bool.")

  def _fit(self, train, head):
    cd = cdtype()
    w = jnp.asarray(head.w, cd)
    sq = jnp.sum(w * w, 0)
    d2 = sq[:, None] + sq[None, :] - 2.0 * matmul(w.T, w)
    dist = jnp.sqrt(jnp.maximum(d2, 0.0))
    dist = jnp.where(jnp.eye(dist.shape[0], dtype=bool), 1.0, dist)
    out = {"inv_dist": 1.0 / dist}
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
    return num / jnp.linalg.norm(h, axis=-1)


class NCI(Detector):
  """NCI: <w_yhat, h - mu> / |h - mu| + alpha |h|_1, mu the mean fit feature, yhat = argmax z."""
  name, needs = "nci", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"alpha": 1e-4}

  def _fit(self, train, head):
    st = stats.moments(train)
    cd = cdtype()
    return {"w": jnp.asarray(head.w, cd), "mean": jnp.asarray(st["sum"] / st["n"], cd)}

  def _score(self, state, features, logits):
    h = fc(features)
    wy = state["w"].T[jnp.argmax(fc(logits), -1)]
    c = h - state["mean"]
    return (jnp.sum(wy * c, -1) / jnp.linalg.norm(c, axis=-1)
            + self.hparams["alpha"] * jnp.sum(jnp.abs(h), -1))

