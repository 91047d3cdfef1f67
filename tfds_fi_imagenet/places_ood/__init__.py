"""The `places_ood` TFDS builder: `places_ood_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
