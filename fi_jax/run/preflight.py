"""Preflight: everything a run will read is checked in seconds, before any compute.

`check(config)` returns every problem at once (not the first one), each a few lines with the
command or source that fixes it; `run(config)` raises `PreflightError` listing them all. What
it checks, without reading any data:
  * every TFDS set the config names is prepared in its data_dir, has the split (TFDS slicing
    such as `train[:10%]` included) and a non-empty size (`tfds.builder(...).info` only);
  * feature files (`source="features"`) exist; a digits spec names a split and some digit;
  * the checkpoint, head and tokenizer files exist and are readable;
  * a config with a released-model architecture but no checkpoint and no training is refused
    unless `random_init=True` says that random weights are meant.
`notes(specs)` then says what the run will use where it is less than the config asks: a
per-class subset (`per_class`, the configs' `fit_per_class`) of a split with fewer classes or
images (its labels are counted, nothing else is read); the run plans exactly those examples.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from absl import logging

from fi_jax import detectors
from fi_jax.data import id_labels, loader
from fi_jax.models import _releases as releases
from fi_jax.models.convert import readers

_BUILD = "python -m tfds_fi_imagenet build {name}{manual} --data_dir={data_dir}"
_TFDS_BUILD = ("tfds.builder({name!r}, data_dir={data_dir!r}).download_and_prepare()  "
               "(a TFDS catalogue dataset)")
_IMAGENET_BUILD = ("python -m tfds_fi_imagenet build imagenet2012 --manual_dir=DIR "
                   "--data_dir={data_dir}   (DIR holds ILSVRC2012_img_train.tar; see "
                   "docs/usage.md, 'imagenet2012')")


class PreflightError(ValueError):
  """Everything that would make the run fail, listed at once."""

  def __init__(self, problems: list[str]):
    self.problems = list(problems)
    text = "\n".join(f"  {i + 1}. " + p.replace("\n", "\n     ")
                     for i, p in enumerate(self.problems))
    super().__init__(f"preflight found {len(self.problems)} problem(s); nothing was computed:\n"
                     + text)


def _get(config, key: str, default: Any = None) -> Any:
  try:
    value = config.get(key, default)
  except AttributeError:
    value = default
  return default if value is None else value


def _as_dict(x) -> dict:
  if x is None:
    return {}
  return x.to_dict() if hasattr(x, "to_dict") else dict(x)


def _readable(path: str, what: str, fix: str) -> Optional[str]:
  if not os.path.exists(path):
    return f"{what} {path} does not exist.\n{fix}"
  if not os.access(path, os.R_OK):
    return f"{what} {path} is not readable (permissions).\n{fix}"
  return None


def check_tfds_set(set_name: str, spec: Mapping) -> Optional[str]:
  """The problem with one tfds spec (not prepared, no such split, empty), or None."""
  # heavy (~1 s) and only for TFDS sets; the package import registers its builders
  import tensorflow_datasets as tfds

  import tfds_fi_imagenet
  from tfds_fi_imagenet import id_shift
  name, split = spec.get("name"), spec.get("split", "test")
  data_dir = spec.get("data_dir") or None
  where = data_dir or "the TFDS default data_dir (~/tensorflow_datasets)"
  dd = data_dir or "DIR"
  if not name:
    return f"{set_name}: a tfds set spec needs a 'name' (e.g. name='fi_imagenet_1k')."
  base = name.split("/")[0].split(":")[0]
  if base == "imagenet2012":
    build = _IMAGENET_BUILD.format(data_dir=dd)
  elif base in {k.split("/")[0] for k in id_shift.FILES}:   # TFDS's own ID-shift builders
    try:
      files = ", ".join(id_shift.files_of(name))
    except ValueError as e:
      files = str(e)
    build = (f"python -m tfds_fi_imagenet.id_shift {name} --manual_dir=DIR --data_dir={dd}  "
             f"(DIR holds {files})")
  elif base in tfds_fi_imagenet.DATASETS:
    manual = " --manual_dir=DIR" if tfds_fi_imagenet.DATASETS[base] else ""
    build = _BUILD.format(name=base, manual=manual, data_dir=dd)
  else:
    build = _TFDS_BUILD.format(name=name, data_dir=dd)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # TFDS raises many kinds; one line
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return (f"{set_name}: TFDS knows no dataset {name!r} ({type(e).__name__}: {first}).\n"
            f"Fix the name, or build it: {build}")
  if not builder.is_prepared():
    return (f"{set_name}: {name} is not prepared in {where}.\n"
            f"Build it: {build}")
  try:
    n = builder.info.splits[split].num_examples
  except Exception as e:  # unknown split or bad slice syntax
    return (f"{set_name}: {name} has no split {split!r} ({' '.join(str(e).split())[:160]}); "
            f"its splits: {', '.join(sorted(builder.info.splits))} (slices like "
            "'train[:10%]' or 'train[:50000]' work too).")
  if not n:
    return f"{set_name}: split {split!r} of {name} in {where} is empty.\nRebuild it: {build}"
  if spec.get("drop_overlaps"):   # the overlap report is readable and covers this set
    from tfds_fi_imagenet import overlap
    try:
      overlap.dropped_file_names(str(spec["drop_overlaps"]), overlap.set_key(builder, split))
    except (FileNotFoundError, ValueError) as e:
      return f"{set_name}: {e}"
  return None


def check_sets(specs: Mapping[str, Mapping]) -> list[str]:
  """Problems of every set spec ({set name: spec})."""
  problems = []
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)   # TFDS warns per missing folder: the problems say it
  try:
    for set_name, spec in specs.items():
      p = _check_set(set_name, dict(spec))
      if p:
        problems.append(p)
  finally:
    logging.set_verbosity(verbosity)
  return problems


def _check_set(set_name: str, spec: dict) -> Optional[str]:
  source = spec.get("source")
  if source == "tfds":
    p = check_tfds_set(set_name, spec)
  elif source == "features":
    path = spec.get("path", "")
    p = (f"{set_name}: source='features' needs a 'path' (a .npz / .safetensors file or a "
         "folder of .npy files)." if not path else
         _readable(path, f"{set_name}: feature file", "Point the spec's path at the arrays you "
                   "extracted (see README, 'Your own features')."))
  elif source == "digits":
    classes = spec.get("classes", range(10))
    split = spec.get("split", "test")
    if split not in ("train", "test", "all"):
      p = f"{set_name}: digits split {split!r}; use 'train', 'test' or 'all'."
    elif not set(classes) & set(range(10)):
      p = (f"{set_name}: the digits spec selects no example (classes={tuple(classes)!r}); "
           "name some of the digits 0-9.")
    else:
      p = None
  elif source is None:
    p = f"{set_name}: the set spec has no 'source' (digits, tfds, features)."
  else:
    p = f"{set_name}: unknown set source {source!r}; use 'digits', 'tfds' or 'features'."
  return p


def _zoo_hint(label: str) -> Optional[str]:
  """Where the weights of a published torchvision / timm model (configs/torchvision.py,
  configs/timm.py: the model label is its zoo name) are downloaded; None for other labels."""
  if not label.startswith(("torchvision/", "timm/", "mae/")):
    return None
  from fi_jax.models import zoo  # imports every family: only for these labels
  try:
    url = zoo.resolve(label)["url"]
  except (KeyError, ValueError):
    return None
  return f"Download {label}'s weights from {url} and pass the local path."


def check_model(config) -> list[str]:
  """Problems of the checkpoint, tokenizer and head files, and of a missing checkpoint."""
  problems = []
  ckpt = _get(config, "model_init", "")
  train = _as_dict(_get(config, "train", {}))
  random_init = bool(_get(config, "random_init", False))
  label = _get(config, "model_label", "") or _get(config, "model_name", "")
  if ckpt:
    # vanity / release names resolve to a file in $FI_JAX_CHECKPOINT_DIR; 'file.npz:sub/key'
    path, hint = releases.resolve_vanity(ckpt, {**releases.VANITY_NAMES,
                                                **releases.SIGLIP_RELEASES})
    path = readers.split_subkey(path)[0]
    hint = _zoo_hint(label) or hint
    p = _readable(path, "checkpoint", f"{hint} (config argument ckpt=PATH; release names are "
                  f"looked up in ${releases.CHECKPOINT_DIR_ENV}.)")
    if p:
      problems.append(p)
  elif not train and not random_init:
    problems.append(
        f"model {label}: no checkpoint (model_init / the config's ckpt= argument) and no "
        "training: the run would use random weights.\nPass ckpt=PATH, or random_init=True "
        "(config argument or --config.random_init=True) if random weights are what you want.")
  head_file = _as_dict(_get(config, "model_load", {})).get("head")
  if head_file:
    p = _readable(head_file, "head file", "Download the model's linear head and pass its path "
                  "(e.g. configs/dinov2.py:head=PATH).")
    if p:
      problems.append(p)
  zs = _as_dict(_get(config, "zero_shot", {}))
  if _get(config, "model_name", "") == "two_towers" and not zs.get("tokenizer"):
    problems.append("SigLIP needs its SentencePiece tokenizer: config argument tokenizer=PATH "
                    "(SigLIP 2: gs://big_vision/gemma_tokenizer.model; SigLIP: "
                    "gs://t5-data/vocabs/cc_en.32000/sentencepiece.model).")
  for key, what in (("tokenizer", "tokenizer"), ("vocab_path", "CLIP vocabulary")):
    if zs.get(key):
      p = _readable(zs[key], what, f"Download it and set config.zero_shot.{key} to its path.")
      if p:
        problems.append(p)
  return problems


def check_detectors(config) -> list[str]:
  """Detectors that work only on some model families (`model_families`: RankFeat) asked for
  with another fi_jax model family (a model given by a dotted module path is not checked)."""
  model = str(_get(config, "model_name", "") or "")
  if not model or "." in model:
    return []
  problems = []
  for name in _get(config, "detectors", ()) or ():
    cls = detectors.REGISTRY.get(name)
    families = cls.model_families if cls is not None else None
    if families is not None and model not in families:
      problems.append(f"detector {name} works only on the model families {list(families)}, "
                      f"not on {model!r}: remove it from config.detectors (the configs' "
                      f"odin=True lists it only for those families).")
  return problems


def check(config, specs: Optional[Mapping[str, Mapping]] = None) -> list[str]:
  """Every problem the run would hit (sets, files, checkpoint), as short texts."""
  if specs is None:
    specs = {"id_fit": _as_dict(config.id_fit), "id_test": _as_dict(config.id_test),
             **{f"ood/{k}": _as_dict(v) for k, v in _as_dict(config.ood).items()}}
  problems = check_sets(specs)
  problems += id_labels.problems(_as_dict(_get(config, "id_labels", {}) or {}),
                                 dict(specs.get("id_test", {})))
  uses_model = any(dict(s).get("source") != "features" for s in specs.values())
  if uses_model:
    problems += check_model(config) + check_detectors(config)
  head = _get(config, "head", "")
  if head:
    p = _readable(head, "head file", "Point config.head at the file with the classifier's "
                  "w [D, C] and b [C].")
    if p:
      problems.append(p)
  return problems


def notes(specs: Mapping[str, Mapping]) -> list[str]:
  """One line per tfds set whose `per_class` subset is smaller than per_class x its classes,
  with the numbers (asked, classes present, examples selected); [] when every set is as
  asked. Call after `run` passed (the sets exist)."""
  out = []
  for set_name, spec in specs.items():
    spec = dict(spec)
    n = spec.get("per_class")
    if spec.get("source") != "tfds" or not n:
      continue
    counts = loader.per_class_counts(spec)
    k, total = len(counts), int(counts.sum())
    if total < n * k:
      short = int((counts < n).sum())
      out.append(f"{set_name}: per_class={n} asks for {n} images of each of {k} classes "
                 f"({n * k}); {spec.get('name')} {spec.get('split', 'test')} has "
                 f"{int((counts > 0).sum())} of the {k} classes ({short} with fewer than {n} "
                 f"images): the run uses the {total} it has.")
  return out


def run(config, specs: Optional[Mapping[str, Mapping]] = None) -> None:
  """Raises PreflightError listing every problem; returns when there is none."""
  problems = check(config, specs)
  if problems:
    raise PreflightError(problems)
