"""Every detector and metric on features / logits you extracted yourself (any framework).

  python main.py --config=configs/features.py:dir=/feats,label=my-resnet50 --workdir=wd

`dir` holds one entry per set, each a .npz, a .safetensors or a folder of .npy files with
`features` [N, D], `logits` [N, C], `label` [N] (ID class; -1 on OOD sets) and optionally
`group` [N] (OOD class id for per-class metrics):

  dir/id_fit.npz      what the detectors fit on (e.g. ImageNet train, or a per-class subset)
  dir/id_test.npz     ID test images
  dir/<ood set>.npz   one per OOD set (all other entries, or those listed in `ood=a+b`)
  dir/<shifted>.npz   covariate-shifted ID sets listed in `csid=a+b` (with ID labels): the
                      full-spectrum rows (docs/metrics.md#full-spectrum)
  dir/head.npz        optional: the classifier's w [D, C] and b [C] (ViM, ReAct, ... need it)

No model is built and nothing is extracted; see fi_jax/extract/own_features.py for the accepted layouts.
"""
import os

import ml_collections

from configs import common

_SETS = ("id_fit", "id_test", "head")
_SUFFIXES = (".npz", ".safetensors", "")


def _entry(folder: str, name: str) -> str:
  """The path of `name` in `folder` with any of the accepted suffixes ('' if none)."""
  for suffix in _SUFFIXES:
    path = os.path.join(folder, name + suffix)
    if os.path.exists(path):
      return path
  return ""


def get_config(arg=None):
  arg = common.parse_arg(arg, dir="", ood="", label="features", id_name="id", preset="ninco",
                         csid="")
  c = common.base_config()
  c.model_name = "features"
  c.model_label = arg.label
  c.id_name = arg.id_name
  c.detector_preset = arg.preset
  c.detectors = common.posthoc_detectors(odin=False)   # ODIN needs the images
  folder = arg.dir
  c.head = _entry(folder, "head") if folder else ""
  spec = lambda name: dict(source="features", path=_entry(folder, name) or
                           os.path.join(folder, name + ".npz"))
  c.id_fit = ml_collections.ConfigDict(spec("id_fit"))
  c.id_test = ml_collections.ConfigDict(spec("id_test"))
  csid = tuple(filter(None, arg.csid.split("+")))
  if arg.ood:
    names = arg.ood.split("+")
  elif folder and os.path.isdir(folder):
    names = sorted({os.path.splitext(e)[0] for e in os.listdir(folder)} - set(_SETS) - set(csid))
  else:
    names = []
  c.csid = ml_collections.ConfigDict({n: spec(n) for n in csid})
  c.csid_order = csid
  c.ood = ml_collections.ConfigDict({n: spec(n) for n in names})
  c.ood_order = tuple(names)
  return c
