"""The `sun_ood` TFDS builder: `sun_ood_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
