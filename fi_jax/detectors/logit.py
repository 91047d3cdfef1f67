"""Logit-only scores: MSP, MaxLogit, Energy, TempScale, GEN, KL-Matching
(docs/detectors.md#logit-scores)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import selection, shared, stats
from fi_jax.detectors.core import (
  Detector,
  cdtype,
  check_choice,
  check_number,
  check_seed,
  energy,
  fc,
  log_max_softmax,
  log_softmax,
  matmul,
  require,
)


class MSP(Detector):
  """Maximum softmax probability (Hendrycks & Gimpel); returned as log max_c p_c (float64)."""
  name, needs = "msp", frozenset({"logits"})

  def _score(self, state, features, logits):
    return log_max_softmax(logits)


class MaxLogit(Detector):
  """max_c z_c (Hendrycks et al.; Vaze et al.)."""
  name, needs = "maxlogit", frozenset({"logits"})

  def _score(self, state, features, logits):
    return jnp.max(fc(logits), axis=-1)


class Energy(Detector):
  """T * logsumexp(z / T) (Liu et al.); T = 1 in OpenOOD and NINCO."""
  name, needs = "energy", frozenset({"logits"})
  defaults = {"temperature": 1.0}

  @classmethod
  def validate(cls, hp):
    check_number("energy", hp, "temperature", lo=0, lo_open=True)

  def _score(self, state, features, logits):
    return energy(logits, self.hparams["temperature"])


# ----------------------------------------------------------------------------- TempScale

@functools.partial(jax.jit, static_argnames=("max_iters",))
def _fit_beta(z, y, beta_lo, beta_hi, max_iters: int = 100):
  """The minimiser of NLL(beta) = mean_i [LSE(beta z_i) - beta z_{i,y_i}] on [beta_lo, beta_hi].

  NLL is convex in beta = 1/T (its second derivative is the variance of z_i under
  softmax(beta z_i)), so its derivative g(beta) = mean_i [E_p z_i - z_{i,y_i}] is
  non-decreasing: safeguarded Newton on g inside a shrinking bracket (a bisection step in
  log-beta whenever Newton leaves the bracket), started at beta = 1, until a step changes beta
  by < 1e-13 relative (at most `max_iters` steps); deterministic. If g has no root in the
  bracket (g(lo) >= 0 or g(hi) <= 0, checked first), the minimiser is that end."""
  zy = jnp.take_along_axis(z, y[:, None], axis=1)[:, 0]

  def grad_hess(beta):
    p = jax.nn.softmax(beta * z, axis=-1)
    ez = jnp.sum(p * z, -1)
    return jnp.mean(ez - zy), jnp.mean(jnp.sum(p * z * z, -1) - ez * ez)

  def cond(carry):
    i, _, _, _, done = carry
    return (i < max_iters) & ~done

  def body(carry):
    i, lo, hi, beta, _ = carry
    g, hss = grad_hess(beta)
    lo = jnp.where(g < 0, beta, lo)
    hi = jnp.where(g > 0, beta, hi)
    newton = beta - g / jnp.maximum(hss, jnp.finfo(z.dtype).tiny)
    inside = (newton > lo) & (newton < hi) & jnp.isfinite(newton)
    nxt = jnp.where(g == 0, beta, jnp.where(inside, newton, jnp.sqrt(lo * hi)))
    done = (jnp.abs(nxt - beta) <= 1e-13 * beta) | (hi <= lo * (1 + 1e-15))
    return i + 1, lo, hi, nxt, done

  # g is non-decreasing: a bracket end where g already has the sign of the root's side is the
  # minimiser (checked first: otherwise the iterates only approach that end geometrically)
  g_lo, _ = grad_hess(beta_lo)
  g_hi, _ = grad_hess(beta_hi)
  beta0 = jnp.clip(jnp.ones_like(beta_lo), beta_lo, beta_hi)
  _, _, _, beta, _ = jax.lax.while_loop(cond, body, (0, beta_lo, beta_hi, beta0,
                                                     (g_lo >= 0) | (g_hi <= 0)))
  return jnp.where(g_lo >= 0, beta_lo, jnp.where(g_hi <= 0, beta_hi, beta))


class TempScale(Detector):
  """max_c softmax(z / T)_c (as its log), T fitted by minimising the NLL of the labelled fit
  rows (OpenOOD fits on val5k with LBFGS from T=1.5; here: the exact 1-D minimiser found by
  safeguarded Newton on the convex NLL(1/T), see `_fit_beta`). At most `max_rows` labelled rows
  are used: all of them when the fit set is smaller (OpenOOD's 5,000-image split: exact), else a
  seeded uniform subset (stats.RowSample, independent of batching)."""
  name, needs = "tempscale", frozenset({"logits", "labels"})
  fit_needs = frozenset({"logits", "labels"})
  defaults = {"t_min": 0.01, "t_max": 100.0, "max_rows": 50_000, "seed": 0}

  @classmethod
  def validate(cls, hp):
    check_number("tempscale", hp, "t_min", lo=0, lo_open=True)
    check_number("tempscale", hp, "t_max", lo=hp["t_min"], lo_open=True)
    check_number("tempscale", hp, "max_rows", lo=1, integer=True)
    check_seed("tempscale", hp)

  def _fit(self, train, head):
    sample = stats.RowSample(self.hparams["max_rows"], self.hparams["seed"], ("logits", "labels"))
    for start, chunk in stats.chunks(train):
      require(chunk.logits is not None and chunk.labels is not None,
              "tempscale needs fit Outputs with logits and labels.")
      c = np.shape(chunk.logits)[1]
      y = np.asarray(chunk.labels)
      sample.add(start, chunk, (y >= 0) & (y < c))
    try:
      s = sample.result()
    except ValueError:
      raise ValueError("tempscale: the fit set has no labelled rows (labels all -1).") from None
    cd = cdtype()
    beta = _fit_beta(jnp.asarray(s["logits"], cd), jnp.asarray(s["labels"], jnp.int32),
                     jnp.asarray(1.0 / self.hparams["t_max"], cd),
                     jnp.asarray(1.0 / self.hparams["t_min"], cd))
    return {"temperature": 1.0 / beta}

  def _score(self, state, features, logits):
    return log_max_softmax(fc(logits) / state["temperature"])


# ----------------------------------------------------------------------------- GEN

class GEN(Detector):
  """Generalized entropy (Liu et al. CVPR'23): -sum_{j<=M} p_(j)^g (1 - p_(j))^g over the M
  largest probabilities (M clamped to C); 1 - p from the log-probabilities (-expm1), so
  saturated softmaxes keep their order."""
  name, needs = "gen", frozenset({"logits"})
  defaults = {"gamma": 0.1, "top_m": 100}
  selection_program = True     # the top-m search's counts: one reduction a pass

  @classmethod
  def validate(cls, hp):
    check_number("gen", hp, "gamma", lo=0, lo_open=True)
    check_number("gen", hp, "top_m", lo=1, integer=True)

  def _score(self, state, features, logits):
    logp = log_softmax(logits)
    m = min(int(self.hparams["top_m"]), logp.shape[-1])
    # log p = z - const per row, so the m largest log-probabilities sit at the m largest logits:
    # select on the model's float32 logits (a float64 top-k is several times slower on CPUs)
    # (selection.top_k_indices: lax.top_k's entries, sort-free; in index order, so the sum
    # below is in another order than the references' descending one)
    z = jnp.asarray(logits)
    if z.dtype == jnp.float32:
      top = jnp.take_along_axis(logp, selection.top_k_indices(z, m), axis=-1)
    else:
      top = jax.lax.top_k(logp, m)[0]
    log1mp = jnp.log(-jnp.expm1(top))
    return -jnp.sum(jnp.exp(self.hparams["gamma"] * (top + log1mp)), axis=-1)


# ----------------------------------------------------------------------------- KL-Matching

@jax.jit
def _klm_templates_chunk(logits):
  z = fc(logits)
  pred = jnp.argmax(z, -1)
  c = z.shape[-1]
  return {"count": jax.ops.segment_sum(jnp.ones_like(pred, cdtype()), pred, c),
          "psum": jax.ops.segment_sum(jnp.exp(log_softmax(z)), pred, c)}


class KLMatching(Detector):
  """-min_k KL(p || d_k), d_k = mean softmax of the fit rows *predicted* as k (Hendrycks et al.).

  A class never predicted on the fit set gets the one-hot template e_k (OpenOOD); its KL is +inf
  unless p is exactly one-hot, so such classes never win the min (NINCO's code would give NaN).
  Terms with p_i = 0 contribute 0 and q_i = 0 < p_i gives +inf (both variants).
  variant='openood': p and the templates are renormalised to sum 1 first (scipy.stats.entropy);
  variant='ninco': the plain sum over p_i != 0 (NINCO / ViM repo). Computed as
  sum_i p_i log p_i - p @ log(d)^T (one [N, C] x [C, C] matmul, float64; where a template has a
  zero entry, one more in float32 counts the entries with p_i > 0 = d_ki, exactly)."""
  name, needs = "klm", frozenset({"logits"})
  fit_needs = frozenset({"logits"})
  defaults = {"variant": "ninco"}
  presets = {"ninco": {"variant": "ninco"}, "openood": {"variant": "openood"}}

  @classmethod
  def validate(cls, hp):
    check_choice("klm", hp, "variant", ("ninco", "openood"))

  def _fit(self, train, head):
    def sums():
      total = None
      for _, chunk in stats.chunks(train):
        require(chunk.logits is not None, "klm needs fit Outputs with logits.")
        total = stats.add_sums(total, _klm_templates_chunk(chunk.logits))
      require(total is not None, "klm: the fit set is empty.")
      return total
    total = shared.memo((train,), ("klm_sums",), sums)      # one pass for both variants
    cnt = total["count"]
    c = len(cnt)
    d = np.where(cnt[:, None] > 0, total["psum"] / np.maximum(cnt, 1.0)[:, None], np.eye(c))
    if self.hparams["variant"] == "openood":
      d = d / d.sum(1, keepdims=True)
    zero = d <= 0
    logd = np.where(zero, 0.0, np.log(np.where(zero, 1.0, d)))
    cd = cdtype()
    return {"log_templates": jnp.asarray(logd, cd), "zero": jnp.asarray(zero, cd),
            "any_zero": jnp.asarray(zero.any())}

  def _score(self, state, features, logits):
    logp = log_softmax(logits)
    if self.hparams["variant"] == "openood":
      logp = logp - jax.nn.logsumexp(logp, axis=-1, keepdims=True)
    p = jnp.exp(logp)
    neg_ent = jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
    kl = neg_ent[:, None] - matmul(p, state["log_templates"].T)
    # +inf where some p_i > 0 meets d_ki = 0. Where every p_i > 0 (a softmax underflows to 0
    # only past a logit gap of ~745) that is every class with a zero entry; otherwise a count
    # of such i, exact in float32 (0/1 entries, sums < 2^24) and ~2x cheaper than float64
    zero = state["zero"]
    hits = lambda: matmul((p > 0).astype(jnp.float32), zero.T.astype(jnp.float32)) > 0
    blocked = lambda: jax.lax.cond(
        jnp.all(p > 0), lambda: jnp.broadcast_to(jnp.any(zero > 0, axis=1)[None, :], kl.shape),
        hits)
    kl = jax.lax.cond(state["any_zero"], lambda: jnp.where(blocked(), jnp.inf, kl), lambda: kl)
    return -jnp.min(kl, axis=-1)
