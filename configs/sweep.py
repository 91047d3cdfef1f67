"""Sweeps: many models x every detector x every OOD set (`python -m fi_jax.run.sweep`).

  python -m fi_jax.run.sweep --config=configs/sweep.py:paper,ckpt_dir=/ckpts,data_dir=/tfds --workdir=runs/paper
  python -m fi_jax.run.sweep --config=configs/sweep.py:openood,ckpt_dir=/ckpts,data_dir=/tfds --workdir=runs/openood --shard=0/2
  python -m fi_jax.run.sweep --config=configs/sweep.py:smoke,dir=/tmp/smoke --workdir=runs/smoke

The argument is the preset's name, then its `k=v` arguments. Presets:

  paper    the models of the Fi-ImageNet-1k paper that fi_jax loads: ResNet-50 (torchvision
           V1), ViT-B/16 AugReg (big_vision .npz), ViT-B/16 (torchvision V1), DeiT-III B/16,
           Swin V2-B (torchvision), ConvNeXt-B (timm, IN-22k fine-tuned), CLIP B/16 (OpenAI)
           and SigLIP 2 B/16 zero-shot, DINOv2 B/14 with its linear head.
  openood  OpenOOD v1.5's ImageNet-1k models: torchvision ResNet-50 (V1), ViT-B/16 (V1),
           Swin-T (V1) and RegNet-Y-16GF (SWAG end-to-end), detector preset "openood".
  smoke    three tiny random-weight models on the demo's digits (ID 0-5) with two stand-in
           OOD sets (digits 6-7, digits 8-9): a timm ViT (model.safetensors written by timm)
           and a torchvision ResNet (.pth written by torch) read from `dir`, and features read
           from `dir/features/` (configs/features.py); `broken=True` adds a fourth model whose
           checkpoint `dir/broken_vit.safetensors` is expected to be damaged. The test
           tests/run/test_sweep.py and bench/sweep.py write these files
           (tests/helpers/sweep_smoke.py).

Arguments of paper / openood: `ckpt_dir` (every checkpoint file, see below), `data_dir` (the
TFDS sets), `ood` ('+'-separated OOD sets), `fit_per_class`, `batch_size`, `odin`,
`layer_detectors`, `preset` (as configs/common.py IMAGENET_ARGS), `n_bootstrap` (each run's
metric CIs), `random_init` (no checkpoints: a dry run of the plumbing), `hardness` (two OOD
sets 'A+B'), `board_bootstrap` (the leaderboard's paired bootstrap resamples), `csid`
('+'-separated covariate-shifted ID sets: every run's full-spectrum rows, and the leaderboard's). In `ckpt_dir`
each checkpoint is the file name of its download URL; a Hugging Face file sits in a folder
named after its repository (`deit3_base_patch16_224.fb_in1k/model.safetensors`);
`checkpoint_files(ckpt_dir)` lists them with their URLs (docs/usage.md, "Reproducing a table").

A sweep config:

  name         the sweep's name (in the leaderboard's title)
  models       tuple of entries, in a fixed order (`--shard=i/n` runs the entries whose index
               % n == i), each a dict with
                 label      its name in every table and its folder <workdir>/<label> (file-safe);
                            default: the run's model label
                 zoo        a fi_jax.models.zoo name (torchvision/..., timm/...), or
                 config     a config file (configs/vit.py) with `args`, its argument string
                 ckpt       optional checkpoint path (config.model_init)
                 overrides  optional {field: value} assigned to its config after `shared`
                            ("a.b" sets a nested field; a dict replaces the whole field)
  args         appended to every model's config arguments (the data and detector settings
               the ImageNet configs share: data_dir=...,ood=...)
  shared       {field: value} assigned to every model's config (e.g. metrics)
  leaderboard  fi_jax/report/leaderboard.py's settings: hardness (numerator, denominator OOD
               sets), detectors ('best_third', 'all' or names), n_bootstrap, seed, ci, alpha,
               primary (the set of the per-model best detector; '' = the numerator)
  cpu_fast_compile   XLA's quick CPU pipeline for the whole sweep (fi_jax/run/xla_flags.py)
"""
import os

import ml_collections

from configs import common
from fi_jax.models import _releases as releases
from fi_jax.models import zoo

PRESETS = ("paper", "openood", "smoke")

# ----------------------------------------------------------------------------- paper / openood

_AUGREG_B16 = ("gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
               "--imagenet2012-steps_20k-lr_0.01-res_224.npz")
_CLIP_FILE = "open_clip_model.safetensors"

# (label, zoo name or config file, config args, download URL of the checkpoint) per model;
# labels are short: they are table columns and folder names
PAPER = (
    ("resnet50-tv1", "torchvision/resnet50.IMAGENET1K_V1", "", None),
    ("vit-b16-augreg", "configs/vit.py", "variant=B/16", _AUGREG_B16),
    ("vit-b16-tv1", "torchvision/vit_b_16.IMAGENET1K_V1", "", None),
    ("deit3-b16", "timm/deit3_base_patch16_224.fb_in1k", "", None),
    ("swinv2-b-tv1", "torchvision/swin_v2_b.IMAGENET1K_V1", "", None),
    ("convnext-b-in22k", "timm/convnext_base.fb_in22k_ft_in1k", "", None),
    ("clip-b16-openai", "configs/clip.py", "name=openai-B/16",
     releases.CLIP_CHECKPOINTS["openai-B/16"][1] + "/resolve/main/" + _CLIP_FILE),
    ("siglip2-b16", "configs/siglip2.py", "release=siglip2_b16_224",
     releases.SIGLIP_RELEASES["siglip2_b16_224"]),
    ("dinov2-b14-linear", "configs/dinov2.py", "variant=B/14",
     releases.dinov2_checkpoint_url("B/14", False)),
)
OPENOOD = (
    ("resnet50-tv1", "torchvision/resnet50.IMAGENET1K_V1", "", None),
    ("vit-b16-tv1", "torchvision/vit_b_16.IMAGENET1K_V1", "", None),
    ("swin-t-tv1", "torchvision/swin_t.IMAGENET1K_V1", "", None),
    ("regnet-y-16gf-swag", "torchvision/regnet_y_16gf.IMAGENET1K_SWAG_E2E_V1", "", None),
)
_DINOV2_HEAD = releases.dinov2_checkpoint_url("B/14", False, "linear4_head")
_SIGLIP2_TOKENIZER = "gs://big_vision/gemma_tokenizer.model"


def local_file(url: str, ckpt_dir: str) -> str:
  """Where a checkpoint downloaded from `url` sits in `ckpt_dir`: its file name, under a
  folder named after the repository for a Hugging Face file."""
  name = url.rsplit("/", 1)[1]
  if "huggingface.co/" in url:
    repo = url.split("huggingface.co/", 1)[1].split("/")[1]
    return os.path.join(ckpt_dir, repo, name)
  return os.path.join(ckpt_dir, name)


def _url(zoo_name: str) -> str:
  """The checkpoint URL of a zoo name."""
  return zoo.resolve(zoo_name)["url"]


def checkpoint_files(preset: str, ckpt_dir: str) -> list:
  """[(local path, URL)] of every file the preset's models read from `ckpt_dir`."""
  table = PAPER if preset == "paper" else OPENOOD
  out = []
  for _, source, _, url in table:
    out.append((local_file(url or _url(source), ckpt_dir), url or _url(source)))
  if preset == "paper":
    out += [(local_file(_DINOV2_HEAD, ckpt_dir), _DINOV2_HEAD),
            (local_file(_SIGLIP2_TOKENIZER, ckpt_dir), _SIGLIP2_TOKENIZER)]
  return out


def _imagenet(preset: str, arg) -> ml_collections.ConfigDict:
  c = _base(preset)
  table = PAPER if preset == "paper" else OPENOOD
  models = []
  for label, source, args, url in table:
    entry = dict(label=label)
    if source.startswith("configs/"):
      entry.update(config=source, args=args)
    else:
      entry["zoo"] = source
    if not arg.random_init:
      entry["ckpt"] = local_file(url or _url(source), arg.ckpt_dir)
    if label == "dinov2-b14-linear" and not arg.random_init:
      entry["args"] += f",head={local_file(_DINOV2_HEAD, arg.ckpt_dir)}"
    if label == "siglip2-b16":   # random_init: no weights, but the zero-shot head's tokenizer
      entry["args"] += f",tokenizer={local_file(_SIGLIP2_TOKENIZER, arg.ckpt_dir)}"
      if arg.random_init:
        entry["overrides"] = {"model_init": ""}   # not the release file
    models.append(entry)
  c.models = tuple(models)
  c.args = (f"data_dir={arg.data_dir},ood={arg.ood},fit_per_class={arg.fit_per_class},"
            f"batch_size={arg.batch_size},odin={arg.odin},layer_detectors={arg.layer_detectors},"
            f"preset={arg.preset or ('openood' if preset == 'openood' else 'ninco')},"
            f"random_init={arg.random_init}" + (f",csid={arg.csid}" if arg.csid else ""))
  c.shared = ml_collections.ConfigDict(dict(
      metrics=dict(tpr=0.95, n_bootstrap=arg.n_bootstrap, per_group=True)))
  c.leaderboard.hardness = tuple(arg.hardness.split("+"))
  c.leaderboard.n_bootstrap = arg.board_bootstrap
  return c


# ----------------------------------------------------------------------------- smoke

# the smoke models' files in `dir` and architectures (tests/helpers/sweep_smoke.py writes them)
SMOKE_FILES = dict(vit="timm_vit_tiny.safetensors", resnet="torchvision_resnet_tiny.pth",
                   features="features", broken="broken_vit.safetensors")
SMOKE_VIT = dict(num_classes=6, patch_size=(2, 2), width=32, depth=2, mlp_dim=64, num_heads=2,
                 pool_type="tok", posemb="learn", act="gelu_exact")
SMOKE_RESNET = dict(num_classes=6, variant="resnet18", depths=(1, 1, 1, 1))
SMOKE_ID = (0, 1, 2, 3, 4, 5)
SMOKE_OOD = {"digits_6-7": (6, 7), "digits_8-9": (8, 9)}
SMOKE_DETECTORS = ("msp", "maxlogit", "energy", "gen", "mds", "knn", "vim", "react")


def smoke_sets() -> dict:
  """The smoke sweep's sets (fields of a run config): digits 0-5 as ID, two OOD sets."""
  return dict(
      id_name="digits_0-5",
      id_fit=dict(source="digits", split="train", classes=SMOKE_ID),
      id_test=dict(source="digits", split="test", classes=SMOKE_ID),
      ood={name: dict(source="digits", split="test", classes=digits, id_classes=SMOKE_ID)
           for name, digits in SMOKE_OOD.items()},
      ood_order=tuple(SMOKE_OOD))


def _smoke(arg) -> ml_collections.ConfigDict:
  if not arg.dir:
    raise ValueError("the smoke preset needs dir=FOLDER (its checkpoint and feature files; "
                     "tests/helpers/sweep_smoke.py writes them).")
  c = _base("smoke")
  image = dict(smoke_sets(), train={}, init_shape=(1, 8, 8, 1), pp="value_range(-1, 1, 0, 16)",
               input_std=(0.5,), batch_size=128, cache_shard_size=128)
  vit = dict(label="timm-vit-tiny", config="configs/demo.py", args="quick",
             ckpt=os.path.join(arg.dir, SMOKE_FILES["vit"]),
             overrides=dict(image, model_name="vit", model=SMOKE_VIT))
  models = [
      vit,
      dict(label="tv-resnet-tiny", config="configs/demo.py", args="quick",
           ckpt=os.path.join(arg.dir, SMOKE_FILES["resnet"]),
           overrides=dict(image, model_name="resnet", model=SMOKE_RESNET)),
      dict(label="features-proj", config="configs/features.py",
           args=f"dir={os.path.join(arg.dir, SMOKE_FILES['features'])},id_name=digits_0-5"),
  ]
  if arg.broken:
    models.append(dict(vit, label="broken-vit",
                       ckpt=os.path.join(arg.dir, SMOKE_FILES["broken"])))
  c.models = tuple(models)
  c.shared = ml_collections.ConfigDict(dict(
      detectors=SMOKE_DETECTORS, detector_preset="ninco",
      detector_hparams=dict(knn=dict(k=10), vim=dict(dim=8)),
      metrics=dict(tpr=0.95, n_bootstrap=arg.n_bootstrap, per_group=True),
      report=dict(sort_by="fpr95", sort_set="", plots=arg.plots, plot_top=3)))
  c.leaderboard.hardness = tuple(SMOKE_OOD)
  c.leaderboard.n_bootstrap = arg.board_bootstrap
  return c


# ----------------------------------------------------------------------------- the config

def _base(name: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = name
  c.models = ()
  c.args = ""
  c.shared = ml_collections.ConfigDict()
  c.leaderboard = ml_collections.ConfigDict(dict(
      hardness=("fi_imagenet_1k", "ninco"), detectors="best_third", n_bootstrap=1000, seed=0,
      ci=0.95, alpha=0.05, primary=""))
  c.cpu_fast_compile = True
  return c


def get_config(arg=None):
  preset, _, rest = (arg or "").partition(",")
  if "=" in preset:
    preset, rest = "", arg
  if preset not in PRESETS:
    raise ValueError(f"name a sweep preset first ({', '.join(PRESETS)}), e.g. "
                     f"configs/sweep.py:smoke,dir=FOLDER; got {arg!r}.")
  if preset == "smoke":
    return _smoke(common.parse_arg(rest, dir="", broken=False, n_bootstrap=20,
                                   board_bootstrap=50, plots=False))
  return _imagenet(preset, common.parse_arg(
      rest, ckpt_dir=os.environ.get(releases.CHECKPOINT_DIR_ENV, "."), data_dir="",
      ood="+".join(common.OOD_SETS), fit_per_class=0, batch_size=256, odin=False,
      layer_detectors=False, preset="", n_bootstrap=1000, random_init=False,
      hardness="fi_imagenet_1k+ninco", board_bootstrap=1000, csid=""))
