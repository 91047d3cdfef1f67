"""Conversions of other ecosystems' checkpoints (timm, torchvision, HF, open_clip, DINOv2) into fi_jax parameter trees."""
