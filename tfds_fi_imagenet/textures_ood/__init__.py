"""The `textures_ood` TFDS builder: `textures_ood_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
