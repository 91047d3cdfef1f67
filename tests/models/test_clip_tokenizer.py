"""fi_jax's CLIP BPE tokenizer against open_clip's bundled SimpleTokenizer (the reference)."""
import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fi_jax.models.text import clip_tokenizer

open_clip_tokenizer = pytest.importorskip("open_clip.tokenizer")

TEXTS = [
    "a photo of a dog.",
    "It's the DOG's toy, isn't it? We'll see; they'd've",
    "café naïve Ünïcödé — “curly quotes” and the ﬁ ligature",
    "日本語のテキスト 123 4567 一二三",
    "emoji 🐶🐱👍🏽 and  multiple\t\nspaces  ",
    "&amp;lt;html&gt; escapes &quot;x&quot;",
    "'s'S''s 're!'ve?'m.'ll,'d 'hello'",
    "",
    "   ",
    "Ｆｕｌｌ－ｗｉｄｔｈ ｔｅｘｔ",
    "don’t stop",
    "a_b-c+d=e/f\\g|h~i`j^k",
    "٣ arabic ٤ digits ½ ² Ⅻ",
    "Straße İstanbul ǅ ΣΊΣΥΦΟΣ",
    "\x00\x01 control \u200b zero-width",
    "a\u0301 combining e\u0308",
    "<start_of_text> inside <end_of_text> text",
    "kite (bird of prey), great white shark",
]


@pytest.fixture(scope="module")
def toks():
  return clip_tokenizer.Tokenizer(), open_clip_tokenizer.SimpleTokenizer()


def test_matches_open_clip_on_varied_texts(toks):
  ours, ref = toks
  got, want = ours(TEXTS), ref(TEXTS).numpy()
  assert got.dtype == np.int32 and got.shape == (len(TEXTS), 77)
  for text, g, w in zip(TEXTS, got, want):
    np.testing.assert_array_equal(g, w, err_msg=repr(text))


def test_long_texts_are_truncated_like_open_clip(toks):
  ours, ref = toks
  texts = ["word " * 200, "x" * 500, "a, " * 40 + "end"]
  got = ours(texts)
  np.testing.assert_array_equal(got, ref(texts).numpy())
  assert (got[:, 0] == ours.sot_id).all() and (got[:, -1] == ours.eot_id).all()
  np.testing.assert_array_equal(ours(texts, context_length=16),
                                ref(texts, context_length=16).numpy())


def test_layout_sot_eot_padding(toks):
  ours, _ = toks
  ids = ours("a photo of a cat")[0]
  n = int((ids != 0).sum())
  assert ids[0] == 49406 and ids[n - 1] == 49407 and (ids[n:] == 0).all()
  assert ids.argmax() == n - 1            # the text tower pools this (EOT) position
  assert ours.decode(ids) == "a photo of a cat"
  assert ours.vocab_size == 49408


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Z"]),
               max_size=60))
def test_matches_open_clip_on_random_text(toks, text):
  ours, ref = toks
  np.testing.assert_array_equal(ours(text), ref(text).numpy())


def test_bad_vocab_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="bpe_simple_vocab_16e6"):
    clip_tokenizer.Tokenizer(str(tmp_path / "missing.txt.gz"))
  plain = tmp_path / "plain.txt.gz"
  plain.write_text("not gzip")
  with pytest.raises(ValueError, match="not CLIP's"):
    clip_tokenizer.Tokenizer(str(plain))
  short = tmp_path / "short.txt.gz"
  with gzip.open(short, "wt") as f:
    f.write("#version\na b\n")
  with pytest.raises(ValueError, match="merge"):
    clip_tokenizer.Tokenizer(str(short))
