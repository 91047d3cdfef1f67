"""Stage 1, data: set specs and the input pipeline (`loader`: TFDS, in-memory and the demo's
digits as per-process padded batches), big_vision-style preprocessing strings
(`preprocess`), ImageNet-1k class names (`class_names`), the 200-class subsets of ImageNet-R/-A
(`class_subsets`) and multi-label ID ground truth (ReImageNet, ReaL) by file name (`id_labels`).

May import: fi_jax.common and the TFDS builders (tfds_fi_imagenet).
"""
