"""The `ninco` TFDS builder: `ninco_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
