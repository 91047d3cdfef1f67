"""NegLabel and CSP (docs/detectors.md#neglabel): equal to the official code's mining and score
(re-implemented in numpy in tests/helpers/detector_reference.py), better than MCM where
negative labels matter, and one clear error without a text bank. GL-MCM (docs/detectors.md#glmcm):
better than MCM where the local score carries the signal, one clear error without it (its
equality with the official code on a tiny CLIP: tests/models/test_glmcm_local.py)."""
import numpy as np
import pytest

from fi_jax import detectors
from fi_jax.data import wordnet_labels
from fi_jax.detectors import vision_language
from fi_jax.metrics import reference as metrics_ref
from tests.helpers import detector_reference as ref

E, C = 16, 6
CODES = {v: k for k, v in wordnet_labels.LEXFILES.items()}


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _bank(name, rng, n_noun=300, n_adj=100, pos=None):
  """A text bank as zero_shot_head.text_bank gives it: nouns in noun.artifact / noun.animal /
  noun.person, adjectives in adj.all / adj.pert, some labels repeated across files."""
  lex = np.asarray([CODES["noun.artifact"]] * (n_noun // 3) + [CODES["noun.animal"]] * (n_noun // 3)
                   + [CODES["noun.person"]] * (n_noun - 2 * (n_noun // 3))
                   + [CODES["adj.all"]] * (n_adj // 2) + [CODES["adj.pert"]] * (n_adj - n_adj // 2),
                   np.int32)
  word = np.arange(len(lex), dtype=np.int32)
  word[n_noun + 5] = 7            # an adjective that repeats noun 7: dropped (noun kept)
  word[n_noun // 3 + 2] = 4       # an animal noun that repeats artifact noun 4
  emb = _unit(rng.normal(size=(len(lex), E))).astype(np.float32)
  if pos is None:
    pos = _unit(rng.normal(size=(C, E))).astype(np.float32)
  emb[3] = _unit(pos[0] + 0.05 * rng.normal(size=E))     # a near-synonym of class 0 (CSP: last)
  return {f"{name}/emb": emb, f"{name}/lexfile": lex, f"{name}/word": word, f"{name}/pos": pos}


def _candidates(bank, name, exclude):
  """The (noun, adjective) candidate embeddings the official code would read from word files
  without the `exclude`d ones, deduplicated (first occurrence)."""
  lex, word = bank[f"{name}/lexfile"], bank[f"{name}/word"]
  keep, seen = [], set()
  for i in range(len(lex)):
    if wordnet_labels.LEXFILES[int(lex[i])] in exclude or word[i] in seen:
      continue
    seen.add(word[i])
    keep.append(i)
  keep = np.asarray(keep)
  noun = np.asarray([wordnet_labels.LEXFILES[int(c)].startswith("noun.") for c in lex[keep]])
  emb = bank[f"{name}/emb"].astype(np.float64)
  return emb[keep[noun]], emb[keep[~noun]]


@pytest.mark.parametrize("name", ["neglabel", "csp"])
@pytest.mark.parametrize("groups", [1, 7])
def test_equals_official_code(name, groups):
  rng = np.random.default_rng(0)
  bank = _bank(name, rng)
  w = (_unit(rng.normal(size=(C, E))) * 30).T.astype(np.float32)
  head = detectors.Head(w, np.zeros(C, np.float32), bank)
  img = rng.normal(size=(40, E)).astype(np.float32)
  det = detectors.build(name, groups=groups)
  state = det.fit(None, head)
  got = np.asarray(det.score(state, detectors.Outputs(img, None)))
  exclude = det.hparams["exclude"].split(",")
  noun, adj = _candidates(bank, name, exclude)
  pos = bank[f"{name}/pos"].astype(np.float64)
  neg = ref.official_neg_mining(noun, adj, pos, csp=name == "csp")
  k = len(neg) - len(neg) % groups
  perm = np.random.default_rng(0).permutation(k)    # the detector's permutation (seed 0)
  want = ref.official_neg_score(img.astype(np.float64), pos, neg, perm, ngroup=groups)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert np.std(got) > 0


def test_csp_ranks_near_synonyms_last_and_positives_from_head():
  rng = np.random.default_rng(1)
  bank = _bank("csp", rng)
  pos = bank["csp/pos"].astype(np.float64)
  noun, adj = _candidates(bank, "csp", vision_language.CSP.defaults["exclude"].split(","))
  neg = vision_language.mine_negatives(bank["csp/emb"].astype(np.float64), bank["csp/lexfile"],
                                       bank["csp/word"], pos, ratio=1.0, percentile=0.95,
                                       exclude=vision_language.CSP.defaults["exclude"], clip_close=True)
  np.testing.assert_array_equal(neg[len(noun) - 1], bank["csp/emb"][3])   # last noun
  # positives="head": the head's normalised columns replace the bank's class embeddings
  w = (pos.T * 3).astype(np.float32)
  bank2 = {**bank, "csp/pos": _unit(rng.normal(size=(C, E))).astype(np.float32)}
  img = rng.normal(size=(10, E)).astype(np.float32)
  a = detectors.build("csp", positives="head", groups=5)
  b = detectors.build("csp", groups=5)
  sa = a.score(a.fit(None, detectors.Head(w, np.zeros(C, np.float32), bank2)),
               detectors.Outputs(img, None))
  sb = b.score(b.fit(None, detectors.Head(w, np.zeros(C, np.float32), bank)),
               detectors.Outputs(img, None))
  np.testing.assert_allclose(np.asarray(sa), np.asarray(sb), rtol=1e-6)


def test_beats_mcm_where_ood_images_match_negative_labels():
  """ID images: a class embedding plus noise; OOD images: the same class part plus a
  direction far from every class (a mined negative label). MCM (T = 1 on cosines) barely sees
  the difference; NegLabel's negatives do."""
  rng = np.random.default_rng(2)
  pos = _unit(rng.normal(size=(C, E)))
  # candidates: half near the classes, half in the orthogonal complement of the class span
  q, _ = np.linalg.qr(np.concatenate([pos.T, rng.normal(size=(E, E - C))], 1))
  far = _unit(rng.normal(size=(200, E - C)) @ q[:, C:].T)
  near = _unit(pos[rng.integers(0, C, 200)] + 0.3 * rng.normal(size=(200, E)))
  emb = np.concatenate([near, far]).astype(np.float32)
  bank = {"neglabel/emb": emb, "neglabel/lexfile": np.full(400, CODES["noun.artifact"], np.int32),
          "neglabel/word": np.arange(400, dtype=np.int32), "neglabel/pos": pos.astype(np.float32)}
  head = detectors.Head(pos.T.astype(np.float32), np.zeros(C, np.float32), bank)
  y = rng.integers(0, C, 300)
  id_img = _unit(pos[y] + rng.uniform(0.2, 1.2, (300, 1)) * rng.normal(size=(300, E)) / 4)
  ood_img = _unit(pos[y] + rng.uniform(0.1, 0.6, (300, 1)) * rng.normal(size=(300, E)) / 4
                  + far[rng.integers(0, 200, 300)])
  id_img, ood_img = id_img.astype(np.float32), ood_img.astype(np.float32)
  aurocs = {}
  for name, kw in (("neglabel", dict(groups=4, ratio=0.5)), ("mcm", {})):
    det = detectors.build(name, **kw)
    state = det.fit(None, head)
    s_id = np.asarray(det.score(state, detectors.Outputs(id_img, None)))
    s_ood = np.asarray(det.score(state, detectors.Outputs(ood_img, None)))
    aurocs[name] = metrics_ref.auroc(s_id, s_ood)
  assert aurocs["neglabel"] > 0.9 and aurocs["neglabel"] > aurocs["mcm"] + 0.15, aurocs


def test_without_a_text_bank_one_clear_error():
  head = detectors.Head(np.eye(4, 3, dtype=np.float32), np.zeros(3, np.float32))
  for name in ("neglabel", "csp"):
    with pytest.raises(ValueError, match="only a two-tower model .CLIP, SigLIP. gives"):
      detectors.build(name).fit(None, head)


def test_hyper_parameters_are_checked():
  with pytest.raises(ValueError, match="exclude='noun.animals'"):
    detectors.build("neglabel", exclude="noun.animals")
  with pytest.raises(ValueError, match="groups"):
    detectors.build("csp", groups=0)
  with pytest.raises(ValueError, match="positives"):
    detectors.build("csp", positives="text")
  rng = np.random.default_rng(3)
  head = detectors.Head(np.eye(E, C, dtype=np.float32), np.zeros(C, np.float32),
                        _bank("neglabel", rng, n_noun=30, n_adj=10))
  with pytest.raises(ValueError, match="groups=100: each group needs at least one"):
    detectors.build("neglabel").fit(None, head)


def test_glmcm_beats_mcm_when_the_object_is_local_and_says_what_it_lacks():
  """ID images whose global embedding is as ambiguous as the OOD ones' but with one patch that
  matches a class (multi-object scenes): the local term separates them, MCM cannot."""
  rng = np.random.default_rng(4)
  pos = _unit(rng.normal(size=(C, E)))
  head = detectors.Head(pos.T.astype(np.float32), np.zeros(C, np.float32))
  glob = _unit(rng.normal(size=(400, E))).astype(np.float32)      # same law for ID and OOD
  local_id = np.log(rng.uniform(0.5, 0.9, 200))                    # log max local softmax
  local_ood = np.log(rng.uniform(0.2, 0.55, 200))
  aurocs = {}
  for name in ("glmcm", "mcm"):
    det = detectors.build(name)
    state = det.fit(None, head)
    s = [np.asarray(det.score(state, detectors.Outputs(
        glob[i:i + 200], None, extras={"layer/local/mcm": loc.astype(np.float32)})))
         for i, loc in ((0, local_id), (200, local_ood))]
    aurocs[name] = metrics_ref.auroc(*s)
  assert aurocs["glmcm"] > 0.85 and aurocs["mcm"] < 0.65, aurocs
  det = detectors.build("glmcm")
  with pytest.raises(ValueError, match="only a CLIP ViT image tower .unrolled, scan=False. gives"):
    det.score(det.fit(None, head), detectors.Outputs(glob, None))
  with pytest.raises(ValueError, match="lambda_local"):
    detectors.build("glmcm", lambda_local=-1)
