"""An official DINOv3 ViT backbone (facebookresearch/dinov3) on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/dinov3.py:name=dinov3_vitb16,ckpt=/ckpts/dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth,data_dir=/tfds

`name`: dinov3_vits16, dinov3_vits16plus, dinov3_vitb16, dinov3_vitl16 or dinov3_vith16plus
(tag `lvd1689m`, the default). The model (fi_jax.models.dinov3 with DINOv3's class-token
pooling; headless: feature-based detectors only) and the official eval transform (Resize(256,
bicubic), CenterCrop(224), ImageNet mean/std) come from fi_jax.models.zoo; the file's download
link is granted by Meta (https://github.com/facebookresearch/dinov3). timm's files with timm's
mean pooling: `configs/timm.py:name=vit_base_patch16_dinov3.lvd1689m`. Other arguments as
configs/timm.py (`dtype`, `res`, the ImageNet benchmark's).
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, name="dinov3_vitb16", ckpt="", dtype="float32", res=0,
                         **common.IMAGENET_ARGS)
  return common.zoo_benchmark("dinov3", arg)
