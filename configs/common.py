"""Pieces shared by the configs: the pipeline's defaults and arg parsing."""
from __future__ import annotations

import re

import ml_collections

from fi_jax.common import detector_names, labels

# The detectors that need only logits/features of a classifier and fit in seconds; configs
# extend this list (see fi_jax.detectors.names() for all). Nothing here imports JAX: the
# command line loads a config (and checks its overrides) before JAX starts.
LOGIT_DETECTORS = ("msp", "maxlogit", "energy")


def posthoc_detectors(odin: bool = False, model_name: str | None = None,
                      layers: bool = False) -> tuple[str, ...]:
  """Every registered detector; the input-gradient ones (ODIN, AdaSCALE: a forward, a backward
  and a second forward per image; RankFeat) only on request, one that works only on some model
  families (`model_families`: RankFeat) only when `model_name` is one of them, and the layer
  detectors (mdsens, gram: every set, the fit set included, is then extracted with per-block
  columns of up to ~400 KB per image; docs/detectors.md#layer-scores) only on request; the
  zero-shot ones that need a two-tower model (`detector_names.TWO_TOWER`) only for those."""
  def wanted(name: str) -> bool:
    families = detector_names.MODEL_FAMILIES.get(name, detector_names.TWO_TOWER.get(name))
    return ((odin or name not in detector_names.INPUT_GRADIENT)
            and (layers or name not in detector_names.LAYERS)
            and (families is None or model_name is None or model_name in families))
  return tuple(n for n in detector_names.NAMES if wanted(n))


def parse_arg(arg: str | None, **defaults):
  """'k=v,k2=v2' -> ConfigDict over `defaults` (types follow the defaults; bare 'k' = True)."""
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    k, eq, v = item.partition("=")
    if k not in defaults:
      raise ValueError(f"Unknown config argument {k!r}; known: {sorted(defaults)}.")
    d = defaults[k]
    if not eq:
      v = True
    elif isinstance(d, bool):
      if v.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"Config argument {k} expects a bool, got {v!r}.")
      v = v.lower() in ("true", "1")
    elif d is not None:
      v = type(d)(v)
    out[k] = v
  return out


# Architecture arguments of the ViT-like families (configs/vit.py, siglip2.py (image tower),
# clip.py (image tower), dinov2.py): 0 = the variant's value. `res` (input size) is per config.
ARCH_ARGS = dict(width=0, depth=0, heads=0, mlp_dim=0, patch=0)


def arch_overrides(arg, patch_tuple: bool = False) -> dict:
  """The Model kwargs of the `ARCH_ARGS` given (non-zero) in `arg`, over the variant's values."""
  names = dict(width="width", depth="depth", heads="num_heads", mlp_dim="mlp_dim",
               patch="patch_size")
  out = {names[k]: arg[k] for k in ARCH_ARGS if arg[k]}
  if patch_tuple and "patch_size" in out:
    out["patch_size"] = (out["patch_size"],) * 2
  return out


def base_config() -> ml_collections.ConfigDict:
  """Fields every config has; see README.md ("Configs") for what each means."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model_name = "vit"            # module under fi_jax/models/
  c.model_label = ""              # name in the report rows (default: model_name)
  c.model = ml_collections.ConfigDict()
  c.model_init = ""               # checkpoint path ('' = train (demo) or random_init)
  c.random_init = False           # True: no checkpoint is intended (random weights; the report says so)
  c.model_load = ml_collections.ConfigDict()
  c.zero_shot = ml_collections.ConfigDict()   # two-tower models: tokenizer, templates, class names
  c.init_shape = (1, 224, 224, 3)
  c.train = ml_collections.ConfigDict()   # empty = no training (released checkpoints)
  c.pp = "decode|resize_small(256)|central_crop(224)|value_range(-1, 1)"
  c.input_std = (0.5, 0.5, 0.5)   # model-input std per [0, 1] pixel unit (ODIN's step size)
  c.batch_size = 256
  c.id_name = "imagenet"
  c.id_fit = ml_collections.ConfigDict()
  c.id_test = ml_collections.ConfigDict()
  c.ood = ml_collections.ConfigDict()
  c.ood_order = ()                # OOD set names in report order (ConfigDict sorts c.ood's keys)
  c.csid = ml_collections.ConfigDict()   # covariate-shifted ID sets: full-spectrum rows (docs/metrics.md)
  c.csid_order = ()               # their order (the FS ID side: id_test, then these)
  # multi-label ID ground truth of an ImageNet-val ID test set (docs/metrics.md#multi-label-id-accuracy):
  # reimagenet = path of the user's ReImageNet reannotation.jsonl, real = TFDS imagenet2012_real,
  # drop_ambiguous = drop the ID test images ReImageNet marks ambiguous
  c.id_labels = ml_collections.ConfigDict(dict(reimagenet="", label_field="", ambiguous_field="",
                                               real=False, drop_ambiguous=False))
  c.detectors = tuple(LOGIT_DETECTORS)   # a tuple, so --config.detectors="('msp',)" works
  c.detector_preset = "ninco"     # 'ninco' | 'openood' | '' (paper defaults)
  c.detector_hparams = ml_collections.ConfigDict()
  c.metrics = ml_collections.ConfigDict(dict(tpr=0.95, n_bootstrap=0, per_group=True))
  # results.md: rows sorted by `sort_by` on OOD set `sort_set` ('' = fi_imagenet_1k, else the
  # first OOD set); plots of the `plot_top` best detectors into <workdir>/plots/.
  c.report = ml_collections.ConfigDict(dict(sort_by="fpr95", sort_set="", plots=True,
                                            plot_top=5))
  c.x64 = True
  c.cache = True
  c.cache_shard_size = 4096       # examples per shard of an extraction (a killed run resumes there)
  c.compilation_cache_dir = "~/.cache/fi_jax/jax_cache"   # JAX's persistent compilation
  #                                 cache ('' = off): a rerun compiles nothing
  c.compile_ahead = True          # while a model trains, compile the rest of the run (fi_jax.run.compile_ahead)
  c.cpu_fast_compile = True       # CPU-only processes: XLA's quick-compiling CPU pipeline
  #                                 (fi_jax.run.xla_flags; about a third less compile time)
  c.nonfinite = "error"           # non-finite features/logits: 'error' | 'drop' (rows, counted)
  return c


# The OOD test sets fi_jax builds with tfds_fi_imagenet (see README "Datasets"), in report order.
OOD_SETS = ("fi_imagenet_1k", "ninco", "ssb_hard", "inaturalist_ood", "openimage_o",
            "textures_ood")

# The covariate-shifted ID sets (full-spectrum evaluation, docs/data.md#id-shift-sets) as TFDS's
# own builders name them (ImageNet-ES: tfds_fi_imagenet's, TFDS has none): {name in the report: (TFDS name[/config], split, class_subset)}. Also
# `imagenet_c_<corruption>_<severity>` (TFDS imagenet2012_corrupted, e.g. imagenet_c_fog_3).
CSID_SETS = {
    "imagenet_v2": ("imagenet_v2/matched-frequency", "test", None),
    "imagenet_v2_threshold": ("imagenet_v2/threshold-0.7", "test", None),
    "imagenet_v2_top": ("imagenet_v2/topimages", "test", None),
    "imagenet_r": ("imagenet_r", "test", "imagenet_r"),
    "imagenet_a": ("imagenet_a", "test", "imagenet_a"),
    "imagenet_sketch": ("imagenet_sketch", "test", None),
    "imagenet_es": ("imagenet_es/param_control", "test", None),   # tfds_fi_imagenet's builder
    "imagenet_es_auto": ("imagenet_es/auto_exposure", "test", None),
}


def csid_spec(name: str, data_dir: str = "") -> dict:
  """The set spec of covariate-shifted ID set `name` (`CSID_SETS` or imagenet_c_<c>_<s>)."""
  m = re.fullmatch(r"imagenet_c_([a-z_]+)_([1-5])", name)
  if m:
    tfds_name, split, subset = f"imagenet2012_corrupted/{m.group(1)}_{m.group(2)}", "validation", None
  elif name in CSID_SETS:
    tfds_name, split, subset = CSID_SETS[name]
  else:
    raise ValueError(f"Unknown covariate-shifted ID set {name!r}; known: {sorted(CSID_SETS)} "
                     "and imagenet_c_<corruption>_<severity 1-5> (e.g. imagenet_c_fog_3).")
  spec = dict(source="tfds", name=tfds_name, split=split, data_dir=data_dir, label_key="label")
  if subset:   # restrict_logits: FS rows in the subset's label space (docs/metrics.md#class-subsets)
    spec.update(class_subset=subset, restrict_logits=True)
  return spec


# The config args (`--config=configs/x.py:k=v,...`) every ImageNet benchmark config takes,
# read by `imagenet_benchmark`: where the TFDS sets are, which OOD sets ('+'-separated), images
# per class of the fit set (0 = all), the input-gradient detectors (ODIN, i-ODIN, AdaSCALE,
# RankFeat) on/off, the layer detectors (mdsens, gram) on/off, the detector preset, the global
# batch size, random_init (run without a checkpoint on purpose: random weights, said in the report),
# the covariate-shifted ID sets of the full-spectrum rows ('+'-separated `CSID_SETS` names; '' = none).
IMAGENET_ARGS = dict(data_dir="", ood="+".join(OOD_SETS), fit_per_class=0, odin=False,
                     layer_detectors=False, preset="ninco", batch_size=256, random_init=False,
                     csid="")


def imagenet_sets(c: ml_collections.ConfigDict, *, data_dir: str = "", ood_sets=OOD_SETS,
                  fit_split: str = "train", fit_per_class: int = 0) -> None:
  """ID fit = imagenet2012 train (optionally `fit_per_class` images per class),
  ID test = Fi-ImageNet-1k `id` (val minus its 655 OOD and 980 ambiguous images),
  OOD = the Fi-ImageNet-1k `ood` split and the other ImageNet OOD sets."""
  dd = data_dir
  c.id_name = "fi_imagenet_1k/id"
  c.id_fit = ml_collections.ConfigDict(dict(
      source="tfds", name="imagenet2012", split=fit_split, data_dir=dd,
      per_class=fit_per_class))
  c.id_test = ml_collections.ConfigDict(dict(
      source="tfds", name="fi_imagenet_1k", split="id", data_dir=dd))
  specs = {}
  for name in ood_sets:
    if name == "fi_imagenet_1k":
      specs[name] = dict(source="tfds", name=name, split="ood", data_dir=dd, label_key=None,
                         group_key="ood_class_id")
    else:
      specs[name] = dict(source="tfds", name=name, split="test", data_dir=dd, label_key=None,
                         group_key="ood_class_id")
  c.ood = ml_collections.ConfigDict(specs)
  c.ood_order = tuple(ood_sets)


def imagenet_benchmark(c: ml_collections.ConfigDict, arg) -> ml_collections.ConfigDict:
  """The part every ImageNet benchmark config shares: batch size, the sets
  (`imagenet_sets`) and the post-hoc detectors, from the `IMAGENET_ARGS` in `arg`."""
  c.batch_size = arg.batch_size
  imagenet_sets(c, data_dir=arg.data_dir, ood_sets=tuple(arg.ood.split("+")),
                fit_per_class=arg.fit_per_class)
  csid = tuple(filter(None, arg.csid.split("+")))
  c.csid = ml_collections.ConfigDict({n: csid_spec(n, arg.data_dir) for n in csid})
  c.csid_order = csid
  c.detectors = posthoc_detectors(arg.odin, c.get("model_name"), arg.layer_detectors)
  c.detector_preset = arg.preset
  c.random_init = arg.random_init
  if arg.random_init and not c.model_init and c.model_label:
    c.model_label += labels.RANDOM_INIT_SUFFIX   # an unset label gets it in fi_jax.run.model_label
  return c


def zoo_pp_at(pp: str, res: int) -> str:
  """A zoo eval pp (resize, then centre crop to C) at crop size `res`: the crop becomes `res`
  and the resize scales with it (timm's crop_pct and torchvision's resize/crop ratio kept)."""
  crop = int(re.search(r"central_crop_torchvision\((\d+)\)", pp).group(1))
  pp = re.sub(r"central_crop_torchvision\(\d+\)", f"central_crop_torchvision({res})", pp)
  pp = re.sub(r"resize_timm\(\d+,", f"resize_timm({res},", pp)
  return re.sub(r"resize_torchvision\((\d+),",
                lambda m: f"resize_torchvision({round(int(m.group(1)) * res / crop)},", pp)


def zoo_benchmark(source: str, arg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """configs/torchvision.py and configs/timm.py: the published checkpoint `name` (a model
  name, optionally with its weights tag) of `source` through `fi_jax.models.zoo` - its model
  family, Model kwargs, input size and eval preprocessing - on the ImageNet benchmark."""
  from fi_jax.models import zoo  # imports every family
  info = zoo.resolve(f"{source}/{arg.name}")
  c = base_config()
  c.model_name = info["family"]
  c.model_label = info["name"]
  model = dict(info["model"])
  if arg.dtype != "float32":
    model["dtype"] = arg.dtype
  c.model = ml_collections.ConfigDict(model)
  c.model_init = arg.ckpt
  c.init_shape = zoo.init_shape(info)
  c.pp = info["pp"]
  if arg.res:
    c.init_shape, c.pp = (1, arg.res, arg.res, 3), zoo_pp_at(info["pp"], arg.res)
    if info["route"] == "torchax":   # its admission check probes at the evaluated size
      c.model.input_size = arg.res
  c.input_std = tuple(info["std"])
  return imagenet_benchmark(c, arg)
