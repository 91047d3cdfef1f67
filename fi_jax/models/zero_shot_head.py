"""Zero-shot classifier heads of image-text models (SigLIP two towers, CLIP), as big_vision's
evaluator builds them, and the predictor `fi_jax.run` uses for such models.

Every (class name, template) text is embedded (`text_embedder`), the L2-normalised embeddings
of a class are averaged and re-normalised; the head is `w = scale * E.T` ([D, C]), `b = bias`
([C]), so for a normalised image embedding z the logits are `z @ w + b` (SigLIP: scale =
exp(t), bias = b; CLIP: scale = exp(logit_scale), bias = 0). Class names / templates are
canonicalised like big_vision's prompt_engineering (lower case, '_' -> ' ', punctuation
removed except ',' in names and '{}' in templates, whitespace collapsed).
"""
from __future__ import annotations

import random
import re
import string
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.common import progress
from fi_jax.common.outputs import Head
from fi_jax.data import class_names, wordnet_labels
from fi_jax.models import _predictor, vit
from fi_jax.models.text import clip_tokenizer, tokenizers

EmbedFn = Callable[[list[str]], np.ndarray]
_PUNCT = str.maketrans("", "", string.punctuation)


def canonicalize(text: str, keep: str = "") -> str:
  """big_vision's _canonicalize: '_'->' ', punctuation removed (the exact string `keep`
  survives), lower case, whitespace collapsed and stripped."""
  text = text.replace("_", " ")
  parts = text.split(keep) if keep else [text]
  text = keep.join(p.translate(_PUNCT) for p in parts)
  return re.sub(r"\s+", " ", text.lower()).strip()


def templates_by_name(name: Union[str, Sequence[str]]) -> list[str]:
  """'clip_paper' (81), 'clip_best' (8), 'class_name_only' (1), or a list of templates."""
  if not isinstance(name, str):
    return list(name)
  if name not in class_names.PROMPT_TEMPLATES:
    raise ValueError(f"Unknown prompt templates {name!r}; known: {sorted(class_names.PROMPT_TEMPLATES)} "
                     "or pass a list of '{}' templates.")
  return list(class_names.PROMPT_TEMPLATES[name])


def openai_templates() -> list[str]:
  """The 80 prompt templates of OpenAI's ImageNet notebook (big_vision's 'clip_paper' less
  its extra bare '{}')."""
  return [t for t in templates_by_name("clip_paper") if t != "{}"]


def class_prompts(class_names: Optional[Sequence[str]] = None,
                  templates: Union[str, Sequence[str]] = "clip_paper", *,
                  canonicalize_text: bool = True, first_class_name_only: bool = False) -> list[list[str]]:
  """[C][T] prompt texts (ImageNet-1k CLIP names by default)."""
  names = list(class_names.IMAGENET_CLASS_NAMES if class_names is None else class_names)
  temps = templates_by_name(templates)
  if canonicalize_text:
    names = [canonicalize(n, keep=",") for n in names]
    temps = [canonicalize(t, keep="{}") for t in temps]
  if first_class_name_only:
    names = [n.split(",")[0] for n in names]
  bad = [t for t in temps if "{}" not in t]
  if bad:
    raise ValueError(f"Prompt template {bad[0]!r} has no '{{}}' for the class name.")
  return [[t.format(n) for t in temps] for n in names]


def class_embeddings(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                     templates: Union[str, Sequence[str]] = "clip_paper", *, batch_size: int = 1024,
                     **prompt_kw) -> np.ndarray:
  """[C, D] float32: per class, the re-normalised mean of its normalised prompt embeddings."""
  prompts = class_prompts(class_names, templates, **prompt_kw)
  flat = [p for ps in prompts for p in ps]
  bar, chunks = progress.bar(len(flat), "zero-shot head", unit="prompt"), []
  for i in range(0, len(flat), batch_size):
    chunks.append(np.asarray(embed_fn(flat[i:i + batch_size]), np.float64))
    bar.update(len(flat[i:i + batch_size]))
  bar.close()
  emb = vit.l2_normalize(np.concatenate(chunks)).reshape(len(prompts), len(prompts[0]), -1)
  return vit.l2_normalize(emb.mean(axis=1)).astype(np.float32)


def head_arrays(embed_fn: EmbedFn, class_names: Optional[Sequence[str]] = None,
                templates: Union[str, Sequence[str]] = "clip_paper", *, scale: float = 1.0,
                bias: float = 0.0, **kw) -> tuple[np.ndarray, np.ndarray]:
  """(w [D, C], b [C]) float32 numpy arrays of the zero-shot head."""
  emb = class_embeddings(embed_fn, class_names, templates, **kw)
  w = (scale * emb.T).astype(np.float32)
  return w, np.full((emb.shape[0],), bias, np.float32)


def accuracy(zimg: np.ndarray, head: Any, labels: np.ndarray) -> float:
  """Top-1 accuracy of argmax(zimg @ w + b); `head` is a Head, a (w, b) pair or w [D, C].
  `labels`: [N] ints, or multi-hot [N, C] (a hit if the argmax is any positive, like ReaL)."""
  if hasattr(head, "w"):
    w, b = head.w, head.b
  elif isinstance(head, tuple):
    w, b = head
  else:
    w, b = head, 0.0
  pred = np.argmax(np.asarray(zimg, np.float64) @ np.asarray(w, np.float64) + np.asarray(b), axis=-1)
  labels = np.asarray(labels)
  if labels.ndim == 2:
    return float(np.mean(labels[np.arange(len(pred)), pred] > 0))
  return float(np.mean(pred == labels))


# ----------------------------------------------------------------------------- text banks
# The negative-label detectors' candidate labels, embedded once per run into `Head.texts`
# (docs/detectors.md#neglabel). Prompts as in the official code: NegLabel (XueJiang16/NegLabel
# @ 3253db6, custom_config/clip.py: prompt_idx_pos = prompt_idx_neg = 85) embeds nouns and
# class names as "the nice {}" and adjectives as "This is a {} photo"; CSP
# (MengyuanChen21/NeurIPS2024-CSP @ 3a7bdab, classifiers/multi_modal.py, class_names.py) embeds
# nouns and class names with 8 templates, and each adjective as one superclass phrase
# ("{} <superclass word>", one of 14 drawn by Python's random.Random(0), one draw per adjective
# in list order) in 4 templates; a label's embedding is the normalised mean of its templates'
# raw (unnormalised) text embeddings.
NEGLABEL_TEMPLATES = {"noun": ("the nice {}",), "adj": ("This is a {} photo",)}
CSP_NOUN_TEMPLATES = ("a close-up photo of the nice {}.", "a photo with the nice {}.",
                      "a good photo with the nice {}.", "a photo of the nice {}.", "{}", "the {}",
                      "the good {}", "the nice {}")
CSP_SUPERCLASS_TEMPLATES = ("{} environment", "{} space", "{} object", "{} scene", "{} place",
                            "{} item", "{} area", "{} view", "{} thing", "{} pattern",
                            "{} structure", "{} landscape", "{} vista", "{} creature")
CSP_ADJ_TEMPLATES = ("{}", "a nice photo of {}", "a good photo of {}", "a close-up photo of {}")
TEXT_BANKS = ("neglabel", "csp")


def bank_prompts(bank: str, rows: Sequence[tuple[str, str]], seed: int = 0) -> list[list[str]]:
  """[M][T] prompt texts of the word list `rows` ([(lexicographer file, label)]) for `bank`."""
  if bank == "neglabel":
    return [[t.format(w) for t in NEGLABEL_TEMPLATES[lex.split(".")[0]]] for lex, w in rows]
  if bank == "csp":
    rng, out = random.Random(seed), []
    for lex, w in rows:
      if lex.startswith("noun."):
        out.append([t.format(w) for t in CSP_NOUN_TEMPLATES])
      else:
        phrase = rng.choice(CSP_SUPERCLASS_TEMPLATES).format(w)
        out.append([t.format(phrase) for t in CSP_ADJ_TEMPLATES])
    return out
  raise ValueError(f"Unknown text bank {bank!r}; known: {list(TEXT_BANKS)}.")


def class_prompts_for_bank(bank: str, names: Sequence[str]) -> list[list[str]]:
  """[C][T] prompts of the ID class names in `bank`'s protocol."""
  temps = NEGLABEL_TEMPLATES["noun"] if bank == "neglabel" else CSP_NOUN_TEMPLATES
  return [[t.format(n) for t in temps] for n in names]


def _mean_embeddings(embed_raw: EmbedFn, prompts: list[list[str]], what: str) -> np.ndarray:
  """[M, E] float32: per row, the normalised mean of its prompts' raw embeddings."""
  counts = np.asarray([len(p) for p in prompts])
  if counts.size == 0 or counts.min() < 1:
    raise ValueError(f"{what}: every label needs at least one prompt (and there must be labels).")
  flat = [p for ps in prompts for p in ps]
  bar, chunks, step = progress.bar(len(flat), what, unit="prompt"), [], 8192
  for i in range(0, len(flat), step):
    chunks.append(np.asarray(embed_raw(flat[i:i + step]), np.float64))
    bar.update(len(flat[i:i + step]))
  bar.close()
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  emb = np.add.reduceat(np.concatenate(chunks), starts, axis=0) / counts[:, None]
  return vit.l2_normalize(emb).astype(np.float32)


def text_bank(embed_raw: EmbedFn, bank: str, class_names_: Optional[Sequence[str]] = None, *,
              word_list: Optional[str] = None, word_limit: int = 0,
              seed: int = 0) -> dict[str, np.ndarray]:
  """The arrays of one text bank, keyed "<bank>/<name>": `emb` [M, E] float32 (the word list's
  labels, normalised), `lexfile` int32 [M] (WordNet's lexicographer-file number), `word` int32
  [M] (the index of the label's first row: equal labels of different files share it), `pos`
  [C, E] float32 (the ID class names in the bank's protocol). `embed_raw`: texts -> raw
  (unnormalised) text embeddings; `word_list`: a file in fi_jax.data.wordnet_labels' format;
  `word_limit` > 0: only the first `word_limit` labels of each section (small smoke runs)."""
  rows = wordnet_labels.load(word_list)
  if word_limit:
    kept, counts = [], {}
    for lex, w in rows:
      counts[lex] = counts.get(lex, 0) + 1
      if counts[lex] <= word_limit:
        kept.append((lex, w))
    rows = kept
  codes = {v: k for k, v in wordnet_labels.LEXFILES.items()}
  unknown = sorted({lex for lex, _ in rows} - set(codes))
  if unknown:
    raise ValueError(f"Word list {word_list or wordnet_labels.WORDS_FILE}: unknown section(s) "
                     f"{unknown}; sections are WordNet lexicographer files "
                     f"({', '.join(sorted(codes))}).")
  first: dict[str, int] = {}
  word = np.asarray([first.setdefault(w, i) for i, (_, w) in enumerate(rows)], np.int32)
  names = list(class_names.IMAGENET_CLASS_NAMES if class_names_ is None else class_names_)
  return {f"{bank}/emb": _mean_embeddings(embed_raw, bank_prompts(bank, rows, seed), f"{bank} labels"),
          f"{bank}/lexfile": np.asarray([codes[lex] for lex, _ in rows], np.int32),
          f"{bank}/word": word,
          f"{bank}/pos": _mean_embeddings(embed_raw, class_prompts_for_bank(bank, names),
                                          f"{bank} classes")}


def local_mcm(local: jax.Array, text_unit: jax.Array, temperature: float = 1.0) -> jax.Array:
  """GL-MCM's local score (AtsuMiyai/GL-MCM @ 8708a08, utils/detection_util.py), as a log:
  log max_{p, c} softmax_c(cos(l_p, t_c) / T) for the patch features `local` [B, P, E] (L2
  normalised here) and the normalised class text embeddings `text_unit` [E, C]: [B] float32."""
  loc = vit.l2_normalize(local.astype(jnp.float32))
  z = jnp.einsum("bpe,ec->bpc", loc, text_unit, precision=jax.lax.Precision.HIGHEST) / temperature
  log_max = jnp.max(z, axis=-1) - jax.nn.logsumexp(z, axis=-1)
  return jnp.max(log_max, axis=-1)


# ----------------------------------------------------------------------------- text towers

def text_embedder(model, params: Mapping[str, Any], tokenizer: Callable[[Sequence[str]], np.ndarray],
                  batch_size: int = 256, pad: str = "pow2",
                  raw: bool = False) -> Callable[[Sequence[str]], np.ndarray]:
  """texts -> [N, E] float32 normalised text embeddings of a two-tower model (SigLIP, CLIP:
  `model.apply({'params': p}, None, tokens)[1]`), jitted in batches of `batch_size` texts;
  `raw=True`: the text tower's output before the L2 normalisation (`[1] * out["txt/norm"]`).

  A short last batch is padded to `batch_size` (pad="batch") or to the next power of two
  below it (pad="pow2": fewer rows, still few compiled shapes). XLA:CPU's results for a row
  can differ in the last bit with the batch's row count, so each family keeps the padding its
  numbers were validated with (CLIP "batch", SigLIP "pow2").
  """
  if pad not in ("batch", "pow2"):
    raise ValueError(f"pad must be 'batch' or 'pow2', got {pad!r}.")
  txt_params = {k: v for k, v in params.items() if k != "img"}

  @jax.jit
  def embed(p, tokens):
    _, ztxt, out = model.apply({"params": p}, None, tokens)
    return ztxt * out["txt/norm"] if raw else ztxt

  def fn(texts: Sequence[str]) -> np.ndarray:
    outs = []
    for i in range(0, len(texts), batch_size):
      chunk = list(texts[i:i + batch_size])
      tokens = tokenizer(chunk)
      size = batch_size if pad == "batch" else min(batch_size, 1 << max(0, (len(chunk) - 1).bit_length()))
      tokens = np.pad(tokens, [(0, size - len(chunk)), (0, 0)])
      outs.append(np.asarray(embed(txt_params, tokens))[:len(chunk)])
    return np.concatenate(outs).astype(np.float32)
  return fn


_SIGLIP_TOKENIZER_HELP = (
    "Two-tower models need config.zero_shot.tokenizer: the SentencePiece model file "
    "(SigLIP: gs://t5-data/vocabs/cc_en.32000/sentencepiece.model, i18n: "
    "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model, SigLIP 2: "
    "gs://big_vision/gemma_tokenizer.model), downloaded to a local path.")


def predictor(model, params: Mapping[str, Any], config, family: str) -> tuple[Callable, Head]:
  """The pipeline's predictor of a two-tower model: images -> (zero-shot logits, normalised
  image embedding), and its `Head`: w = exp(t) * class_embeddings.T, b = the model's bias `b`
  (0 without one), i.e. the model's own image-text logits.

  `config.zero_shot` (all optional unless said): class_names (default ImageNet-1k CLIP names),
  templates, batch_size (256), canonicalize_text, first_class_name_only, text_banks (the
  `TEXT_BANKS` to embed into `Head.texts`; the runner sets it from the detectors), word_list
  (the banks' word list; default the shipped WordNet list), word_limit (0: every label; N: the
  first N of each WordNet file, for smoke runs), local_temperature (GL-MCM's local score, CLIP
  only; default 1), and per family:
    "siglip": tokenizer (required: SentencePiece model path), tokenizer_kind ("siglip" |
      "siglip_i18n" | "siglip2"); templates default "clip_paper", canonicalize_text True.
    "clip" (CLIP, PE-Core): vocab_path (CLIP BPE file; default: open_clip's copy; texts are
      tokenized to the text tower's context length); templates default OpenAI's 80,
      canonicalize_text False (CLIP's own protocol keeps prompts verbatim).
  """
  zs = dict(config.get("zero_shot", None) or {})
  if family == "siglip":
    path, kind = zs.pop("tokenizer", None), zs.pop("tokenizer_kind", "siglip")
    if not path:
      raise ValueError(_SIGLIP_TOKENIZER_HELP)
    seq_len = int(np.shape(params["txt"]["pos_embedding"])[1])
    tok, pad = tokenizers.get_tokenizer(kind, path, max_len=seq_len), "pow2"
    templates = zs.pop("templates", None) or "clip_paper"
    precision = None
  elif family == "clip":
    context = int(np.shape(params["txt"]["pos_embedding"])[1])   # CLIP 77, PE-Core 32 / 72
    tok, pad = clip_tokenizer.Tokenizer(zs.pop("vocab_path", None), context_length=context), "batch"
    zs.setdefault("canonicalize_text", False)
    templates = zs.pop("templates", None) or openai_templates()
    precision = jax.lax.Precision.HIGHEST
  else:
    raise ValueError(f"Unknown zero-shot family {family!r}; use 'siglip' or 'clip'.")
  banks, words = tuple(zs.pop("text_banks", ()) or ()), zs.pop("word_list", None)
  word_limit = int(zs.pop("word_limit", 0) or 0)
  batch = int(zs.pop("batch_size", 256))
  embed = text_embedder(model, params, tok, batch, pad)
  texts = None
  if banks:
    embed_raw = text_embedder(model, params, tok, batch, pad, raw=True)
    names = zs.get("class_names", None)
    texts = {}
    for bank in banks:
      texts.update(text_bank(embed_raw, bank, names, word_list=words, word_limit=word_limit))
  scale = float(np.exp(np.asarray(jax.device_get(params["t"])).reshape(-1)[0]))
  bias = float(np.asarray(params["b"]).reshape(-1)[0]) if "b" in params else 0.0
  local_t = float(zs.pop("local_temperature", 1.0))
  if not local_t > 0:
    raise ValueError(f"config.zero_shot.local_temperature must be > 0, got {local_t}.")
  w, b = head_arrays(embed, zs.pop("class_names", None), templates, scale=scale, bias=bias, **zs)
  w, b = jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32)

  def predict(p, images):
    zimg, _, _ = model.apply({"params": p}, images)
    return jnp.dot(zimg, w, precision=precision) + b, zimg

  # for layer detectors (fi_jax.extract.layer_columns): also the model's out; CLIP's carries
  # out["img/local_mcm"], GL-MCM's local score (`local_mcm`)
  # (the scanned encoder has no value path: GL-MCM then says the column is missing)
  local = family == "clip" and not getattr(model, "scan", False)
  out_model = model.clone(local_tokens=True) if local else model
  text_unit = w / jnp.linalg.norm(w, axis=0, keepdims=True)

  def predict_out(p, images):
    zimg, _, out = out_model.apply({"params": p}, images)
    if "img/local" in out:
      out["img/local_mcm"] = local_mcm(out["img/local"], text_unit, local_t)
    return jnp.dot(zimg, w, precision=precision) + b, zimg, out
  return _predictor.with_out(predict, predict_out), Head(w, b, texts)
