"""A big_vision / AugReg / timm ViT classifier on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/vit.py:ckpt=/ckpts/B_16-i21k-300ep-...-res_224.npz,data_dir=/tfds

Needs: the checkpoint file (`ckpt`, a big_vision/AugReg .npz or a timm ViT .safetensors; e.g.
gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz)
and, in `data_dir`, the prepared TFDS sets: imagenet2012 (train, the detectors' fit set; TFDS's
own builder with the manual tar), fi_imagenet_1k, ninco, ssb_hard, inaturalist_ood,
openimage_o, textures_ood (python -m tfds_fi_imagenet build ...). Drop OOD sets you have not
built with `ood=fi_imagenet_1k+ninco`.

Arguments: `ckpt`; `variant` (B/16, L/16, ...); `width`, `depth`, `heads`, `mlp_dim`, `patch`
(0 = the variant's; for a checkpoint of another shape); `res` (input size; the posemb is
resampled at load if the checkpoint's grid differs, with a warning); `pool` (tok/gap/map);
`rep_size`; `timm_gelu` (exact GELU, timm weights); and the common ImageNet ones
(configs/common.py IMAGENET_ARGS). The report's model label is `vit-<variant>` (`vit-B16`; the
rule: fi_jax/common/labels.py; `--config.model_label=...` sets one).
"""
import ml_collections

from configs import common
from fi_jax.common.labels import short_label


def get_config(arg=None):
  arg = common.parse_arg(arg, ckpt="", variant="B/16", pool="tok", res=224, rep_size=0,
                         timm_gelu=False, **common.ARCH_ARGS, **common.IMAGENET_ARGS)
  c = common.base_config()
  c.model_name = "vit"
  c.model_label = short_label("vit", arg.variant)
  c.model = ml_collections.ConfigDict(dict(
      num_classes=1000, variant=arg.variant, pool_type=arg.pool, rep_size=arg.rep_size or False,
      # random_init: a random head too (big_vision's zero-initialised head gives all-zero
      # logits, so every logit detector would be degenerate); a checkpoint replaces it anyway
      head_zeroinit=not arg.random_init,
      act="gelu_exact" if arg.timm_gelu else "gelu",
      **common.arch_overrides(arg, patch_tuple=True)))
  c.model_init = arg.ckpt
  c.init_shape = (1, arg.res, arg.res, 3)
  # vit_jax / AugReg evaluation: squash resize to the resolution, values in [-1, 1].
  c.pp = f"decode|resize({arg.res})|value_range(-1, 1)"
  return common.imagenet_benchmark(c, arg)
