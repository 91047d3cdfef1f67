"""The `inaturalist_ood` TFDS builder: `inaturalist_ood_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
