"""Zero-shot heads: names/templates data, canonicalisation, averaging, accuracy, SigLIP predictor."""
import ast
import importlib.util
import zlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fi_jax.data import class_names as imagenet_names
from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import two_towers
from fi_jax.models import zero_shot_head as zero_shot


def test_class_names_and_templates():
  names = imagenet_names.IMAGENET_CLASS_NAMES
  assert len(names) == 1000 and names[0] == "tench" and names[21] == "kite (bird of prey)"
  assert names[999] == "toilet paper"
  t = imagenet_names.PROMPT_TEMPLATES
  assert len(t["clip_paper"]) == 81 and t["clip_paper"][0] == "a bad photo of a {}." and t["clip_paper"][-1] == "{}"
  assert len(t["clip_best"]) == 8 and t["clip_best"][0] == "itap of a {}."
  assert t["class_name_only"] == ("{}",)


def test_data_agrees_with_open_clip():
  """Cross-check with open_clip's copy (read as data, without importing torch)."""
  spec = importlib.util.find_spec("open_clip")
  if spec is None:
    pytest.skip("open_clip not installed")
  path = spec.submodule_search_locations[0] + "/zero_shot_metadata.py"
  tree = ast.parse(open(path, encoding="utf-8").read())
  found = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
      name = node.targets[0].id
      if name == "IMAGENET_CLASSNAMES":
        found[name] = tuple(e.value for e in node.value.elts)
      else:  # lambda c: f'...{c}...'
        found[name] = tuple("".join(p.value if isinstance(p, ast.Constant) else "{}"
                                    for p in lam.body.values) for lam in node.value.elts)
  assert found["IMAGENET_CLASSNAMES"] == imagenet_names.IMAGENET_CLASS_NAMES
  assert found["OPENAI_IMAGENET_TEMPLATES"] + ("{}",) == imagenet_names.PROMPT_TEMPLATES["clip_paper"]
  assert found["SIMPLE_IMAGENET_TEMPLATES"] + ("{}",) == imagenet_names.PROMPT_TEMPLATES["clip_best"]


def test_canonicalize_like_big_vision():
  assert zero_shot.canonicalize("kite (bird of prey)", keep=",") == "kite bird of prey"
  assert zero_shot.canonicalize("a bad photo of a {}.", keep="{}") == "a bad photo of a {}"
  assert zero_shot.canonicalize("Yellow lady's_slipper,  Cypripedium", keep=",") == "yellow ladys slipper, cypripedium"
  prompts = zero_shot.class_prompts(["Great White shark", "kite (bird of prey)"], "clip_best")
  assert prompts[0][0] == "itap of a great white shark" and prompts[1][-1] == "kite bird of prey"
  first = zero_shot.class_prompts(["ant, emmet"], ["{}"], first_class_name_only=True)
  assert first == [["ant"]]
  with pytest.raises(ValueError, match="no '{}'"):
    zero_shot.class_prompts(["a"], ["a photo"])
  with pytest.raises(ValueError, match="Unknown prompt templates"):
    zero_shot.templates_by_name("clip_worst")


def _fake_embed(texts):
  """Deterministic pseudo text embeddings (unnormalised), one per text."""
  return np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=6) * 3 for t in texts])


def test_class_embeddings_average_and_renormalise():
  names, temps = ["cat", "dog", "ray"], ["a {}", "the {}", "{}"]
  emb = zero_shot.class_embeddings(_fake_embed, names, temps, batch_size=2)
  for c, n in enumerate(names):
    e = _fake_embed([t.format(n) for t in temps])
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    m = e.mean(0)
    np.testing.assert_allclose(emb[c], m / np.linalg.norm(m), atol=1e-6)
  w, b = zero_shot.head_arrays(_fake_embed, names, temps, scale=10.0, bias=-2.0)
  assert w.shape == (6, 3) and b.tolist() == [-2.0] * 3
  np.testing.assert_allclose(w, 10 * emb.T, atol=1e-5)


def test_accuracy_single_and_multilabel():
  w = np.eye(3)
  z = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 0.]])
  assert zero_shot.accuracy(z, w, np.array([0, 2, 0])) == pytest.approx(2 / 3)
  assert zero_shot.accuracy(z, (w, np.array([0, 0, 5.])), np.array([2, 2, 2])) == 1.0
  multi = np.array([[1, 1, 0], [0, 0, 0], [0, 1, 1]])
  assert zero_shot.accuracy(z, w, multi) == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- SigLIP end to end

@pytest.fixture(scope="module")
def tiny_siglip(tmp_path_factory):
  spm = pytest.importorskip("sentencepiece")
  d = tmp_path_factory.mktemp("zs")
  corpus = [t.format(n) for n in imagenet_names.IMAGENET_CLASS_NAMES[:200]
            for t in imagenet_names.PROMPT_TEMPLATES["clip_best"]]
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=str(d / "t5"), vocab_size=200,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=0.995,
                                 minloglevel=2, num_threads=1)
  model = two_towers.Model(image=dict(patch_size=(8, 8), width=32, depth=1, mlp_dim=64, num_heads=4, pool_type="map"),
                           text=dict(width=32, depth=1, mlp_dim=64, num_heads=4, vocab_size=200),
                           out_dim=(None, 32), bias_init=-10.0, text_len=16)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]
  rng = np.random.default_rng(0)
  params = ckpt.recover_tree({k: (rng.normal(size=v.shape) * 0.3).astype(np.float32)
                              for k, v in ckpt.flatten(shapes).items()})
  return model, params, str(d / "t5.model")


def test_text_embedder_matches_model(tiny_siglip):
  from fi_jax.models.text import tokenizers
  model, params, spm_path = tiny_siglip
  tok = tokenizers.get_tokenizer("siglip", spm_path, max_len=16)
  texts = ["itap of a tench", "a photo of the small goldfish", "a origami hen"]
  got = zero_shot.text_embedder(model, params, tok, batch_size=2)(texts)
  want = jax.jit(model.apply)({"params": params}, None, tok(texts))[1]
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_siglip_predictor(tiny_siglip, monkeypatch):
  model, params, spm_path = tiny_siglip
  names = list(imagenet_names.IMAGENET_CLASS_NAMES[:5])
  config = ml_collections.ConfigDict(dict(zero_shot=dict(
      tokenizer=spm_path, tokenizer_kind="siglip", class_names=names, templates="clip_best", batch_size=8)))
  predict, head = two_towers.predictor(model, params, config)
  assert np.shape(head.w) == (32, 5) and np.shape(head.b) == (5,)
  images = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
  logits, feats = jax.jit(predict)(params, images)
  np.testing.assert_allclose(logits, feats @ np.asarray(head.w) + np.asarray(head.b), atol=1e-4)
  # SigLIP's own pairwise logits for one prompt per class agree with a one-template head.
  _, head1 = two_towers.predictor(model, params, ml_collections.ConfigDict(dict(zero_shot=dict(
      tokenizer=spm_path, class_names=names, templates="class_name_only"))))
  from fi_jax.models.text import tokenizers
  tok = tokenizers.get_tokenizer("siglip", spm_path, max_len=16)
  zimg, ztxt, out = jax.jit(model.apply)({"params": params}, images, tok([zero_shot.canonicalize(n, keep=",") for n in names]))
  np.testing.assert_allclose(feats @ np.asarray(head1.w) + np.asarray(head1.b),
                             zimg @ ztxt.T * out["t"] + out["b"], atol=1e-4)
  with pytest.raises(ValueError, match="zero_shot.tokenizer"):
    two_towers.predictor(model, params, ml_collections.ConfigDict())
