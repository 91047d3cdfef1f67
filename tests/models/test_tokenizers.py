"""SentencePiece tokenizers vs the references (sentencepiece itself, transformers SigLIP / SigLIP 2
tokenizers built offline from the same model file, trained here on the fly)."""
import os
import shutil

import numpy as np
import pytest

from fi_jax.data import class_names as imagenet_names
from fi_jax.models import zero_shot_head as zero_shot
from fi_jax.models.text import tokenizers

spm = pytest.importorskip("sentencepiece")

TEXTS = ["a photo of a dog", "A Bad Photo of the Goldfish",
         "itap of a great white shark in a video game seen from far away", "x",
         "art of the small Électric ray", ""]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """T5-like (pad 0, eos 1, unk 2, no bos; unigram) and Gemma-like (pad 0, eos 1, bos 2, unk 3;
  BPE, byte fallback, no dummy prefix) SentencePiece models trained on ImageNet prompts."""
  d = tmp_path_factory.mktemp("spm")
  corpus = [t.format(n) for n in imagenet_names.IMAGENET_CLASS_NAMES[:300]
            for t in imagenet_names.PROMPT_TEMPLATES["clip_best"]]
  common = dict(character_coverage=0.995, minloglevel=2, num_threads=1)
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=str(d / "t5"),
                                 vocab_size=300, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 model_type="unigram", **common)
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=str(d / "gemma"),
                                 vocab_size=400, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                                 model_type="bpe", byte_fallback=True, add_dummy_prefix=False,
                                 **common)
  return {"t5": str(d / "t5.model"), "gemma": str(d / "gemma.model"), "dir": d}


def _sp(path):
  p = spm.SentencePieceProcessor()
  p.Load(path)
  return p


def test_siglip_conventions(models):
  tok = tokenizers.get_tokenizer("siglip", models["t5"], max_len=8)
  sp = _sp(models["t5"])
  out = tok(TEXTS)
  assert out.shape == (len(TEXTS), 8) and out.dtype == np.int32
  for text, row in zip(TEXTS, out):
    ids = sp.EncodeAsIds(tokenizers.ascii_lower(text)) + [1]
    want = ids[:7] + [1] if len(ids) >= 8 else ids + [1] * (8 - len(ids))  # sticky EOS, pad 1
    assert row.tolist() == want
  assert out[:, -1].tolist() == [1] * len(TEXTS)  # "last" pooling always reads an EOS


def test_ascii_only_lowercase():
  assert tokenizers.ascii_lower("ÄBC Éclair") == "Äbc Éclair"  # tf.strings.lower semantics


def test_siglip_matches_transformers(models):
  transformers = pytest.importorskip("transformers")
  ref = transformers.SiglipTokenizer(vocab_file=models["t5"])
  tok = tokenizers.get_tokenizer("siglip", models["t5"], max_len=12)
  # HF's tokenizer also strips punctuation (big_vision does that in the prompt canonicaliser),
  # and lower-cases all of Unicode: compare on canonicalised ASCII prompts.
  texts = [zero_shot.canonicalize(t) for t in TEXTS if t.isascii()]
  want = ref(texts, padding="max_length", max_length=12, truncation=True)["input_ids"]
  np.testing.assert_array_equal(tok(texts), np.asarray(want))


def test_siglip2_conventions_and_transformers(models):
  tok = tokenizers.get_tokenizer("siglip2", models["gemma"], max_len=10)
  sp = _sp(models["gemma"])
  out = tok(TEXTS)
  for text, row in zip(TEXTS, out):
    ids = sp.EncodeAsIds(tokenizers.ascii_lower(text)) + [1]
    want = ids[:9] + [1] if len(ids) >= 10 else ids + [0] * (10 - len(ids))  # sticky EOS, pad 0
    assert row.tolist() == want
  assert out[0, -1] == 0  # short text: the last position is a pad (as in big_vision)
  transformers = pytest.importorskip("transformers")
  hf_dir = models["dir"] / "hf_gemma"
  os.makedirs(hf_dir, exist_ok=True)
  shutil.copy(models["gemma"], hf_dir / "tokenizer.model")
  ref = transformers.Siglip2Tokenizer.from_pretrained(str(hf_dir), local_files_only=True)
  for text, row in zip([t for t in TEXTS if t.isascii()], tok([t for t in TEXTS if t.isascii()])):
    ids = ref(text, add_special_tokens=False)["input_ids"] + [1]
    want = ids[:9] + [1] if len(ids) >= 10 else ids + [0] * (10 - len(ids))
    assert row.tolist() == want, text


def test_eos_modes_and_bos(models):
  sp = _sp(models["gemma"])
  base = sp.EncodeAsIds("a photo of a dog")
  for eos, want_tail in (("none", base[:4]), ("yes", base[:4]), ("sticky", base[:3] + [1])):
    tok = tokenizers.SentencePieceTokenizer(models["gemma"], max_len=4, eos=eos)
    assert tok(["a photo of a dog"])[0].tolist() == want_tail
  tok = tokenizers.SentencePieceTokenizer(models["gemma"], max_len=20, eos="yes", add_bos=True)
  assert tok("a photo of a dog")[0].tolist()[:len(base) + 2] == [2] + base + [1]


def test_errors(tmp_path, models):
  with pytest.raises(FileNotFoundError, match="gs://big_vision/gemma_tokenizer.model"):
    tokenizers.get_tokenizer("siglip2", str(tmp_path / "nope.model"))
  with pytest.raises(ValueError, match="Unknown tokenizer kind"):
    tokenizers.get_tokenizer("bert", models["t5"])
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    tokenizers.get_tokenizer("siglip", str(bad))
