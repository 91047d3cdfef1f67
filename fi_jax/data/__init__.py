"""Stage 1, data: set specs and the input pipeline (`loader`: TFDS, in-memory and the demo's
digits as per-process padded batches), big_vision-style preprocessing strings
(`preprocess`) and ImageNet-1k class names (`class_names`).

May import: fi_jax.common and the TFDS builders (tfds_fi_imagenet).
"""
