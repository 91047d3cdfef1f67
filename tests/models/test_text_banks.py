"""Text banks of a two-tower model (fi_jax.models.zero_shot_head.text_bank), and NegLabel, CSP
and GL-MCM end to end on a tiny random CLIP written as a real open_clip checkpoint: the runner's
build_model embeds the word list once, and the detectors' scores equal the official code's
(tests/helpers/detector_reference.py) on open_clip's own text and image embeddings. GL-MCM's
local features: fi_jax's value path (fi_jax.models.clip `local_tokens`) equals GL-MCM's
official computation (AtsuMiyai/GL-MCM @ 8708a08442e5650889052fd86900969fade06a1b,
clip/model.py: the last block with v through out_proj plus x, then the MLP residual, ln_post,
proj) done on open_clip's weights; the score follows its utils/detection_util.py."""
import random

import jax
import numpy as np
import pytest

from fi_jax import detectors
from fi_jax.data import wordnet_labels
from fi_jax.models import zero_shot_head as zs
from tests.helpers import detector_reference as ref
from tests.models import test_clip as tc

torch = pytest.importorskip("torch")
ml_collections = pytest.importorskip("ml_collections")
F = torch.nn.functional

NAMES = ["cat", "dog", "tench"]


@pytest.fixture(scope="module")
def word_file(tmp_path_factory):
  """A small word list in the shipped format: nouns of three files (one label repeated across
  files), adjectives of one file."""
  rows = wordnet_labels.load()
  by = {}
  for lex, w in rows:
    by.setdefault(lex, []).append(w)
  small = ([("noun.artifact", w) for w in by["noun.artifact"][:14]]
           + [("noun.plant", w) for w in by["noun.plant"][:12]]
           + [("noun.shape", w) for w in by["noun.shape"][:10] + [by["noun.artifact"][2]]]
           + [("adj.all", w) for w in by["adj.all"][:16]])
  path = tmp_path_factory.mktemp("words") / "words.txt"
  path.write_text(wordnet_labels.dumps(small))
  return str(path), small


def test_shipped_list_loads_and_is_bounded(tmp_path):
  rows = wordnet_labels.load()
  assert len(rows) > 80000 and ("noun.artifact", "hydraulic pump") in rows
  assert {lex for lex, _ in rows} == set(wordnet_labels.LEXFILES.values())
  big = tmp_path / "big.txt"
  with open(big, "wb") as f:
    f.truncate(wordnet_labels.MAX_TEXT_BYTES + 1)
  with pytest.raises(ValueError, match="larger than"):
    wordnet_labels.load(str(big))
  bad = tmp_path / "bad.txt"
  bad.write_text("orphan\n# noun.act\nrun\n")
  with pytest.raises(ValueError, match="before any '# <section>' line"):
    wordnet_labels.load(str(bad))


def test_recipe_on_a_wordnet_dict_folder(tmp_path):
  """build() reads WordNet's data files: first word per synset, '_' -> ' ', adjective markers
  dropped, lower case, repeats within a file once."""
  (tmp_path / "data.noun").write_text(
      "  1 licence header\n"
      "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | gloss\n"
      "00002000 06 n 02 Hydraulic_pump 0 pump 0 000 | gloss\n"
      "00002100 06 n 01 hydraulic_pump 1 000 | gloss\n")
  (tmp_path / "data.adj").write_text("00001740 00 a 01 galore(ip) 0 000 | gloss\n")
  assert wordnet_labels.build(str(tmp_path)) == [
      ("noun.Tops", "entity"), ("noun.artifact", "hydraulic pump"), ("adj.all", "galore")]


def test_bank_prompts_follow_the_official_recipes():
  rows = [("noun.act", "run"), ("adj.all", "red"), ("adj.all", "blue")]
  assert zs.bank_prompts("neglabel", rows) == [["the nice run"], ["This is a red photo"],
                                               ["This is a blue photo"]]
  csp = zs.bank_prompts("csp", rows)
  assert csp[0] == [t.format("run") for t in zs.CSP_NOUN_TEMPLATES]
  rng = random.Random(0)                      # one draw per adjective, in list order
  for row, word in zip(csp[1:], ("red", "blue")):
    phrase = rng.choice(zs.CSP_SUPERCLASS_TEMPLATES).format(word)
    assert row == [t.format(phrase) for t in zs.CSP_ADJ_TEMPLATES]


def _official_embeddings(m, tok, prompts):
  """[M, E]: per label the normalised mean of its prompts' raw open_clip text embeddings
  (NegLabel: one prompt, normalised; CSP: the mean of encode_text over its templates)."""
  flat = [p for ps in prompts for p in ps]
  with torch.no_grad():
    z = m.encode_text(torch.tensor(tok(flat)).long()).double().numpy()
  out, i = [], 0
  for ps in prompts:
    mean = z[i:i + len(ps)].mean(0)
    out.append(mean / np.linalg.norm(mean))
    i += len(ps)
  return np.stack(out)


def _official_local(m, images):
  """[B, P, E] local features and [B, E] global ones, as GL-MCM's VisionTransformer.forward."""
  vis, seen = m.visual, {}
  blocks = vis.transformer.resblocks
  hook = blocks[-1].register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
  with torch.no_grad():
    glob = m.encode_image(tc._torch_img(images))
    hook.remove()
    x, blk = seen["x"], blocks[-1]          # [B, N, C]: open_clip's blocks are batch-first
    c = x.shape[-1]
    y = F.linear(blk.ln_1(x), blk.attn.in_proj_weight, blk.attn.in_proj_bias)
    v = F.linear(y[..., 2 * c:], blk.attn.out_proj.weight, blk.attn.out_proj.bias) + x
    v = v + blk.mlp(blk.ln_2(v))
    local = vis.ln_post(v)[:, 1:] @ vis.proj
  return local.double().numpy(), glob.double().numpy()


@pytest.mark.slow
def test_zero_shot_detectors_on_a_tiny_clip_equal_the_official_code(word_file, tmp_path_factory):
  from configs import common
  from fi_jax.run import model as run_model
  m, path, act = tc._written(True, tmp_path_factory)
  tok = tc.clip_tokenizer.Tokenizer()
  words, rows = word_file
  c = common.base_config()
  c.model_name = "clip"
  c.model = ml_collections.ConfigDict(dict(
      out_dim=tc.EMBED, act=act, image=dict(width=64, depth=2, num_heads=2, patch_size=tc.PATCH),
      text=dict(width=32, depth=2, num_heads=2)))
  c.init_shape = (1, tc.RES, tc.RES, 3)
  c.model_init = path
  c.detectors = ("neglabel", "csp", "glmcm")
  c.zero_shot = ml_collections.ConfigDict(dict(class_names=NAMES, templates=["a photo of a {}."],
                                               word_list=words, batch_size=64))
  predict, params, head, _ = run_model.build_model(c, log=lambda s: None)
  assert "word_list" in c.zero_shot and "text_banks" not in c.zero_shot   # caller's config kept
  images = np.random.RandomState(1).randn(12, tc.RES, tc.RES, 3).astype(np.float32)
  with jax.default_matmul_precision("highest"):
    _, feats, out = jax.jit(predict.with_out)(params, images)
  local, img = _official_local(m, images)
  assert tc._max_diff(out["img/local"], local) < 1e-5
  np.testing.assert_allclose(np.asarray(feats), img / np.linalg.norm(img, axis=1, keepdims=True),
                             atol=2e-6)
  for name, exclude in (("neglabel", ()), ("csp", ())):
    # the official code's word files: nouns of every file, then adjectives, deduplicated
    seen, nouns, adjs = set(), [], []
    for lex, w in rows:
      if w not in seen and lex not in exclude:
        seen.add(w)
        (nouns if lex.startswith("noun.") else adjs).append((lex, w))
    pos = _official_embeddings(m, tok, zs.class_prompts_for_bank(name, NAMES))
    noun_emb = _official_embeddings(m, tok, zs.bank_prompts(name, nouns))
    adj_emb = _official_embeddings(m, tok, zs.bank_prompts(name, adjs))
    neg = ref.official_neg_mining(noun_emb, adj_emb, pos, neg_topk=0.5, csp=name == "csp")
    det = detectors.build(name, ratio=0.5, groups=3)
    got = np.asarray(det.score(det.fit(None, head), detectors.Outputs(np.asarray(feats), None)))
    k = len(neg) - len(neg) % 3
    want = ref.official_neg_score(img, pos, neg, np.random.default_rng(0).permutation(k),
                                  ngroup=3)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.std(got) > 1e-6

  # GL-MCM: the official score (higher = ID here), max softmax of the global cosines / T plus
  # lambda times the max over patches and classes of the local softmax (local T = 1)
  text = np.asarray(head.w, np.float64)
  text /= np.linalg.norm(text, axis=0, keepdims=True)
  g = img / np.linalg.norm(img, axis=1, keepdims=True)
  loc = local / np.linalg.norm(local, axis=-1, keepdims=True)
  extras = {"layer/local/mcm": np.asarray(out["img/local_mcm"])}
  for lam, temp in ((1.0, 1.0), (0.5, 0.1)):
    det = detectors.build("glmcm", lambda_local=lam, temperature=temp)
    got = np.asarray(det.score(det.fit(None, head), detectors.Outputs(feats, None, extras=extras)))
    sg = torch.softmax(torch.tensor(g @ text / temp), -1).numpy().max(-1)
    sl = torch.softmax(torch.tensor(loc @ text), -1).numpy().max(axis=(1, 2))
    np.testing.assert_allclose(got, sg + lam * sl, rtol=1e-5)


def test_value_path_needs_the_unrolled_encoder():
  with pytest.raises(ValueError, match="needs the unrolled encoder"):
    jax.eval_shape(lambda: tc._fi_model("quick_gelu", scan=True).clone(local_tokens=True).init(
        jax.random.PRNGKey(0), np.zeros((1, tc.RES, tc.RES, 3), np.float32)))
