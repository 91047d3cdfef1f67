"""Multi-label ground truth for the ImageNet validation images of an ID test set.

Two sources, joined to a set's rows by the images' file names (`ILSVRC2012_val_<8 digits>`,
the TFDS `file_name` feature of every ImageNet-val set here and of TFDS's own builders):

- ReImageNet (`reannotation.jsonl`, Hugging Face vrg-prague/ReImageNet; the user's own copy,
  never bundled: its licence forbids redistribution), read by `tfds_fi_imagenet.reannotation`
  (which documents what it assumes about the file's fields); it also marks ambiguous images;
- ReaL (Beyer et al. 2020), from TFDS's own `imagenet2012_real` builder prepared in a data_dir.

`set_file_names(spec)` lists a TFDS set's file names in set order (the order `loader`
reads it in); an image with an empty label set (no ImageNet-1k class) is left out of the
multi-label accuracy (fi_jax.metrics.multilabel).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from fi_jax.data import loader


def set_file_names(spec: dict) -> list[str]:
  """The `file_name` of every example of a tfds set spec, in set order (row i of its arrays
  is example i, or example `_id[i]` where rows were dropped)."""
  if spec.get("source") != "tfds":
    raise ValueError("ReImageNet / ReaL labels join the ID test set by file name: it must be a "
                     f"tfds set (source='tfds'), not source={spec.get('source')!r}.")
  if spec.get("per_class"):
    raise ValueError("ReImageNet / ReaL labels need the whole ID test split, not a per_class "
                     "subset.")
  loader._tf()   # TF set up (GPUs hidden) before TFDS reads
  import tensorflow_datasets as tfds
  builder = tfds.builder(spec["name"], data_dir=spec.get("data_dir") or None)
  if "file_name" not in builder.info.features:
    raise ValueError(f"{spec['name']} has no file_name feature: its rows cannot be matched to "
                     "ImageNet validation images.")
  ds = builder.as_dataset(split=spec.get("split", "test"), shuffle_files=False,
                          decoders=tfds.decode.PartialDecoding({"file_name": True}),
                          read_config=tfds.ReadConfig(interleave_cycle_length=1))
  return [ex["file_name"].decode() for ex in tfds.as_numpy(ds)]


def rows_file_names(file_names: Sequence[str], arrays: dict) -> list[str]:
  """The file name of each row of a set's arrays (through `_id` where rows were dropped)."""
  ids = arrays.get("_id")
  if ids is None:
    if len(file_names) != len(arrays["logits"]):
      raise ValueError(f"the set has {len(arrays['logits'])} rows but its split "
                       f"{len(file_names)} examples.")
    return list(file_names)
  return [file_names[int(i)] for i in np.asarray(ids)]


def reimagenet(path: str, file_names: Sequence[str], *, label_field: str = "",
               ambiguous_field: str = "") -> tuple[list[tuple[int, ...]], np.ndarray]:
  """(label set, ambiguous flag) of each named image from ReImageNet's reannotation.jsonl."""
  from tfds_fi_imagenet import reannotation  # registers the builders too (heavy): only here
  records = reannotation.read(path, label_field=label_field or None,
                              ambiguous_field=ambiguous_field or None)
  sets = reannotation.label_sets(records, file_names)
  ids = [int(reannotation.imagenet_val.VAL_ID_RE.search(n).group(1)) for n in file_names]
  return sets, np.array([records[i].ambiguous for i in ids], bool)


def real(data_dir: Optional[str], file_names: Sequence[str]) -> list[tuple[int, ...]]:
  """The ReaL label set of each named image, from TFDS's prepared `imagenet2012_real`."""
  loader._tf()
  import tensorflow_datasets as tfds
  builder = tfds.builder("imagenet2012_real", data_dir=data_dir or None)
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"imagenet2012_real is not prepared in {builder.data_dir}: prepare TFDS's builder first "
        "(python -m tfds_fi_imagenet.id_shift imagenet2012_real --manual_dir=DIR "
        "--data_dir=DIR, with ILSVRC2012_img_val.tar and real.json in DIR).")
  ds = builder.as_dataset(split="validation", decoders=tfds.decode.PartialDecoding(
      {"file_name": True, "real_label": True}))
  labels = {ex["file_name"].decode(): tuple(sorted(int(v) for v in ex["real_label"]))
            for ex in tfds.as_numpy(ds)}
  missing = [n for n in file_names if n not in labels]
  if missing:
    raise ValueError(f"{len(missing)} image(s) are not in imagenet2012_real (first: "
                     f"{missing[:3]}); the ID test set must be ImageNet validation images.")
  return [labels[n] for n in file_names]


def problems(cfg: dict, id_test: dict) -> list[str]:
  """What in `config.id_labels` (`cfg`) would fail after the extraction, found before it: the
  ID test set not a tfds set, the reannotation file missing or not readable as
  `tfds_fi_imagenet.reannotation` assumes (its whole check runs: ~1 s for 50,000 lines),
  imagenet2012_real not prepared, drop_ambiguous without a reannotation file."""
  path, use_real = cfg.get("reimagenet") or "", bool(cfg.get("real"))
  out = []
  if cfg.get("drop_ambiguous") and not path:
    out.append("config.id_labels.drop_ambiguous needs config.id_labels.reimagenet (the path of "
               "ReImageNet's reannotation.jsonl).")
  if not (path or use_real):
    return out
  if id_test.get("source") != "tfds" or id_test.get("per_class"):
    out.append("config.id_labels: ReImageNet / ReaL labels join the ID test set by file name, so "
               "it must be a whole tfds split (source='tfds', no per_class).")
  if path:
    from tfds_fi_imagenet import reannotation
    try:
      reannotation.read(path, label_field=cfg.get("label_field") or None,
                        ambiguous_field=cfg.get("ambiguous_field") or None)
    except (OSError, ValueError) as e:
      out.append(f"config.id_labels.reimagenet: {e}")
  if use_real:
    loader._tf()
    import tensorflow_datasets as tfds
    try:
      prepared = tfds.builder("imagenet2012_real",
                              data_dir=id_test.get("data_dir") or None).is_prepared()
    except Exception:  # noqa: BLE001  (an unreadable data_dir: the set checks say more)
      prepared = False
    if not prepared:
      out.append("config.id_labels.real: TFDS imagenet2012_real is not prepared in "
                 f"{id_test.get('data_dir') or 'the default data_dir'} (python -m "
                 "tfds_fi_imagenet.id_shift imagenet2012_real --manual_dir=DIR --data_dir=DIR).")
  return out
