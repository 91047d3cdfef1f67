"""Zero-shot scores of two-tower models: MCM (docs/detectors.md#mcm), NegLabel and CSP
(docs/detectors.md#neglabel, #csp), GL-MCM (docs/detectors.md#glmcm)."""
from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import wordnet_labels
from fi_jax.detectors.core import (
  Detector,
  cdtype,
  check_choice,
  check_number,
  check_seed,
  fc,
  head_state,
  l2_normalize,
  l2_normalize_jit,
  log_max_softmax,
  matmul,
)
from fi_jax.extract import layer_columns as layer_lib


class MCM(Detector):
  """Maximum concept matching (Ming et al.): s = max_c softmax_c(cos(f, t_c) / tau), returned as
  its log (float64). f = the L2-normalised image embedding (Outputs.features); t_c = column c of
  the zero-shot Head's w, L2-normalised (w = logit scale x normalised prompt-averaged text
  embeddings, so normalising removes the scale; the bias is ignored). tau = 1 (OpenOOD, NINCO)."""
  name, needs = "mcm", frozenset({"features", "head"})
  defaults = {"temperature": 1.0}

  @classmethod
  def validate(cls, hp):
    check_number("mcm", hp, "temperature", lo=0, lo_open=True)

  def _fit(self, train, head):
    return {"text": l2_normalize_jit(fc(head_state(head)["w"]), axis=0)}

  def _score(self, state, features, logits):
    cos = matmul(l2_normalize(fc(features)), state["text"])
    return log_max_softmax(cos / self.hparams["temperature"])


# ----------------------------------------------------------------------------- negative labels

_NOUN_CODES = frozenset(k for k, v in wordnet_labels.LEXFILES.items() if v.startswith("noun."))


class _NegativeLabels(Detector):
  """NegLabel's mining, grouping and score (docs/detectors.md#neglabel), shared with CSP.

  fit: the candidate labels are the rows of the text bank `Head.texts["<bank>/..."]` (the
  word list embedded by the two-tower model once per run) whose WordNet lexicographer file is
  not in `exclude`, each label kept once (its first row). Per candidate e: d(e) = the
  `percentile` quantile (linear interpolation) of its cosines to the ID class embeddings t_c
  (CSP: d = 1 where the largest cosine exceeds 0.95); nouns and adjectives are ranked
  separately by d ascending (farthest from the ID labels first) and the first
  int(ratio * count) of each are the negative labels (nouns, then adjectives). Grouping: the
  last K mod `groups` negatives are dropped, the rest permuted (numpy default_rng(seed)) and
  split into `groups` equal groups. score: with f the normalised image embedding and
  cosines / temperature as logits, per group g the softmax mass of the ID labels against the
  ID labels plus group g's negatives, sigmoid(LSE_c(f.t_c / T) - LSE_{n in g}(f.n / T)),
  averaged over the groups (float64).

  `positives`: "paper" (the ID class names embedded with the method's own prompts, stored in
  the bank as `<bank>/pos`) or "head" (the run's zero-shot head: its normalised columns)."""
  needs, fit_needs = frozenset({"features", "head"}), frozenset()
  text_bank: ClassVar[str] = ""
  clip_close: ClassVar[bool] = False       # CSP: d = 1 where max cosine > 0.95
  score_only = frozenset({"temperature"})

  @classmethod
  def validate(cls, hp):
    check_number(cls.name, hp, "temperature", lo=0, lo_open=True)
    check_number(cls.name, hp, "ratio", lo=0, hi=1, lo_open=True)
    check_number(cls.name, hp, "percentile", lo=0, hi=1)
    check_number(cls.name, hp, "groups", lo=1, integer=True)
    check_seed(cls.name, hp)
    check_choice(cls.name, hp, "positives", ("paper", "head"))
    v = hp["exclude"]
    names = set(wordnet_labels.LEXFILES.values())
    bad = [x for x in (v.split(",") if isinstance(v, str) and v else []) if x not in names]
    if not isinstance(v, str) or bad:
      raise ValueError(f"{cls.name}: hyper-parameter exclude={v!r} is invalid; valid: '' or "
                       f"comma-separated WordNet lexicographer files ({', '.join(sorted(names))}).")

  def _bank(self, head) -> dict:
    texts = getattr(head, "texts", None) or {}
    keys = ("emb", "lexfile", "word", "pos")
    missing = [k for k in keys if f"{self.text_bank}/{k}" not in texts]
    if missing:
      raise ValueError(
          f"{self.name} needs the text embeddings of a word list (Head.texts['{self.text_bank}/"
          f"...']), which only a two-tower model (CLIP, SigLIP) gives: the runner embeds them "
          f"when config.detectors names {self.name}; this model has no text tower.")
    return {k: np.asarray(texts[f"{self.text_bank}/{k}"]) for k in keys}

  def _fit(self, train, head):
    hp, bank = self.hparams, self._bank(head)
    if hp["positives"] == "head":
      pos = np.asarray(head.w, np.float64).T
    else:
      pos = np.asarray(bank["pos"], np.float64)
    pos = pos / np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-12)
    neg = mine_negatives(np.asarray(bank["emb"], np.float64), bank["lexfile"], bank["word"],
                         pos, exclude=hp["exclude"], ratio=hp["ratio"],
                         percentile=hp["percentile"], clip_close=self.clip_close)
    groups = group_negatives(neg, hp["groups"], hp["seed"], self.name)
    return {"pos": jnp.asarray(pos.T, cdtype()), "neg": jnp.asarray(groups, cdtype())}

  def _score(self, state, features, logits):
    t = self.hparams["temperature"]
    f = l2_normalize(fc(features))
    lp = jax.nn.logsumexp(matmul(f, state["pos"]) / t, axis=-1)
    g, m, e = state["neg"].shape
    ln = jax.nn.logsumexp(matmul(f, state["neg"].reshape(g * m, e).T).reshape(-1, g, m) / t,
                          axis=-1)
    return jnp.mean(jax.nn.sigmoid(lp[:, None] - ln), axis=-1)


def mine_negatives(emb, lexfile, word, pos, *, exclude: str, ratio: float, percentile: float,
                   clip_close: bool = False, block: int = 4096) -> np.ndarray:
  """NegMining: [K, E] negative labels (nouns, then adjectives) of the bank's rows `emb`
  [M, E] (see _NegativeLabels); `pos` [C, E] normalised ID class embeddings."""
  codes = {v: k for k, v in wordnet_labels.LEXFILES.items()}
  excluded = [codes[x] for x in exclude.split(",") if x]
  rows = np.flatnonzero(~np.isin(lexfile, excluded))
  _, first = np.unique(np.asarray(word)[rows], return_index=True)
  rows = rows[np.sort(first)]
  d = np.empty(len(rows))
  for i in range(0, len(rows), block):
    sim = emb[rows[i:i + block]] @ pos.T
    d[i:i + block] = np.quantile(sim, percentile, axis=1)
    if clip_close:
      d[i:i + block][sim.max(axis=1) > 0.95] = 1.0
  noun = np.isin(np.asarray(lexfile)[rows], list(_NOUN_CODES))
  parts = []
  for part in (noun, ~noun):
    idx = np.flatnonzero(part)
    order = idx[np.argsort(d[idx], kind="stable")]
    parts.append(order[:int(len(idx) * ratio)])
  return emb[rows[np.concatenate(parts)]]


def group_negatives(neg, groups: int, seed: int, name: str = "neglabel") -> np.ndarray:
  """[groups, m, E]: the negatives less the last K mod groups, permuted, in equal groups."""
  k = len(neg) - len(neg) % groups
  if k == 0:
    raise ValueError(f"{name}: {len(neg)} negative labels for groups={groups}: each group needs "
                     f"at least one; lower groups or raise ratio.")
  perm = np.random.default_rng(seed).permutation(k)
  return np.asarray(neg[:k])[perm].reshape(groups, k // groups, -1)


class NegLabel(_NegativeLabels):
  """NegLabel (Jiang et al., ICLR 2024; XueJiang16/NegLabel @ 3253db6): negative labels mined
  from WordNet nouns and adjectives, grouped score (see _NegativeLabels). Defaults from the
  official ImageNet config (custom_config/clip.py): ratio 0.15, percentile 0.95, 100 groups,
  temperature 0.01 (the code's t=1 on 100 x cosines); its word files leave out
  noun.animal and noun.food."""
  name, text_bank = "neglabel", "neglabel"
  defaults = {"temperature": 0.01, "ratio": 0.15, "percentile": 0.95, "groups": 100, "seed": 0,
              "exclude": "noun.animal,noun.food", "positives": "paper"}


class CSP(_NegativeLabels):
  """CSP, the conjugated semantic pool (Chen et al., NeurIPS 2024;
  MengyuanChen21/NeurIPS2024-CSP @ 3a7bdab): NegLabel with adjectives embedded as superclass
  phrases ("<adjective> <superclass word>", the bank "csp"), candidates whose largest cosine to
  an ID label exceeds 0.95 ranked last, and the official ImageNet config's exclusions
  (custom_config/clip-ViT-B16.py: noun.person, noun.quantity, noun.group, adj.pert, on word files
  without noun.animal and noun.food)."""
  name, text_bank, clip_close = "csp", "csp", True
  defaults = {"temperature": 0.01, "ratio": 0.15, "percentile": 0.95, "groups": 100, "seed": 0,
              "exclude": "noun.animal,noun.food,noun.person,noun.quantity,noun.group,adj.pert",
              "positives": "paper"}


# ----------------------------------------------------------------------------- GL-MCM

class GLMCM(Detector):
  """GL-MCM (Miyai et al., IJCV 2025; AtsuMiyai/GL-MCM @ 8708a08, utils/detection_util.py):
  s = max_c softmax_c(cos(f, t_c) / T) + lambda_local * max_{p, c} softmax_c(cos(l_p, t_c) / T_l),
  the global MCM probability plus the weighted local one (cosines in float32 as the official
  code computes them, the rest float64). f = the normalised image
  embedding, t_c = the zero-shot head's normalised columns, l_p = the image tower's patch
  features in the embedding space (the last block with each token attending to itself, ln_post,
  the projection; fi_jax.models.clip `local_tokens`). The local term is computed during
  extraction (the column `layer/local/mcm`, with T_l = config.zero_shot.local_temperature,
  default 1 = the official T); `temperature` is the global term's (official default 1 for
  both). CLIP ViT models only."""
  name = "glmcm"
  needs = frozenset({"features", "head", "layers"})
  layer_reducers = ("local",)
  defaults = {"temperature": 1.0, "lambda_local": 1.0}

  @classmethod
  def validate(cls, hp):
    check_number("glmcm", hp, "temperature", lo=0, lo_open=True)
    check_number("glmcm", hp, "lambda_local", lo=0)

  def _fit(self, train, head):
    return {"text": l2_normalize_jit(head_state(head)["w"], axis=0)}

  def _score_args(self, state, outputs):
    col = layer_lib.column("local", "mcm")
    if col not in (outputs.extras or {}):
      raise ValueError(
          f"glmcm needs the local (patch) score '{col}' in the scored Outputs.extras (extras: "
          f"{sorted(outputs.extras or {}) or 'none'}): only a CLIP ViT image tower (unrolled, "
          f"scan=False) gives it, computed during extraction; this model or set has none.")
    return outputs.features, outputs.extras[col]

  def _score(self, state, features, local):
    # cosines in float32 (Precision.HIGHEST), as the official code computes them; the softmax
    # and the sum in the compute dtype
    f = l2_normalize(jnp.asarray(features, jnp.float32))
    z = fc(matmul(f, state["text"].astype(jnp.float32))) / self.hparams["temperature"]
    glob = 1.0 / jnp.sum(jnp.exp(z - jnp.max(z, axis=-1, keepdims=True)), axis=-1)
    return glob + self.hparams["lambda_local"] * jnp.exp(fc(local).reshape(-1))
