"""DINOv3 ViT-7B/16 + its ImageNet-1k linear classifier on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/dinov3.py:ckpt=/ckpts/dinov3_vit7b16_pretrain_lvd1689m-a955f4ea.pth,head=/ckpts/dinov3_vit7b16_imagenet1k_linear_head-90d8ed92.pth,dtype=bfloat16,data_dir=/tfds

`name`: dinov3_vit7b16_lc (tag `imagenet1k`, the default; hubconf's `dinov3_vit7b16_lc`, the
only classifier DINOv3 publishes). `ckpt`: the 7B backbone file, `head`: the linear head file
(https://dl.fbaipublicfiles.com/dinov3/dinov3_vit7b16/..., links on request from Meta;
`zoo.resolve("dinov3/dinov3_vit7b16_lc")` gives both urls). The head reads concat(class token,
patch-token mean): that 8192-d vector is the features (`pre_logits`). The model
(fi_jax.models.dinov3) and the official eval transform (Resize(256, bicubic), CenterCrop(224),
ImageNet mean/std) come from fi_jax.models.zoo. Other arguments as configs/timm.py (`dtype`,
`res`, the ImageNet benchmark's).
"""
import ml_collections

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, name="dinov3_vit7b16_lc", ckpt="", head="", dtype="float32",
                         res=0, **common.IMAGENET_ARGS)
  c = common.zoo_benchmark("dinov3", arg)
  if arg.head:
    c.model_load = ml_collections.ConfigDict(dict(head=arg.head))
  return c
