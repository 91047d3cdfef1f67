"""A timm classifier (its published weights) on Fi-ImageNet-1k and the ImageNet OOD sets.

  python main.py --config=configs/timm.py:name=convnext_tiny.fb_in22k_ft_in1k,ckpt=/ckpts/model.safetensors,data_dir=/tfds

`name` is timm's model name with an optional pretrained tag (no tag = timm's default tag;
every name: `python -m fi_jax.models list`). The model family,
input size and eval preprocessing (the pretrained config's crop_pct, interpolation, mean/std)
come from fi_jax.models.zoo. Needs: `ckpt`, the `model.safetensors` of the HF hub repo
`timm/<name>` (url: `zoo.resolve("timm/<name>")["url"]`), and in `data_dir` the prepared TFDS
sets (see configs/vit.py). `dtype=bfloat16` computes in bf16;
`res=N` evaluates at input size N (crop N, the resize scaled with it; 0 = the weights'). The
report's model label is the canonical name (`<source>/<model>.<tag>`).
"""
from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, name="convnext_tiny.fb_in22k_ft_in1k", ckpt="", dtype="float32",
                         res=0, **common.IMAGENET_ARGS)
  return common.zoo_benchmark("timm", arg)
