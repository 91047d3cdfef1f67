"""Stage 2, models: one public file per model family (`vit`, `resnet`, `clip`, `two_towers`,
...; found by `config.model_name`), each with `Model` and its own `load()`; `convert/` holds
the key maps from timm / torchvision / HF / open_clip / DINOv2 files and the file readers;
`text/` the text towers and tokenizers; `zero_shot_head` the zero-shot classifier head of
two-tower models; `zoo` the table of released checkpoints (`python -m fi_jax.models list`
prints it). Modules starting with `_` are infrastructure (checkpoint trees, release names,
timm's recorded pretrained tags, position-embedding resampling, shared blocks, the predictor
contract).

May import: fi_jax.common, fi_jax.data.
"""
