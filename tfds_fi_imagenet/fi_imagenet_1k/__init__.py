"""The `fi_imagenet_1k` TFDS builder: `fi_imagenet_1k_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
