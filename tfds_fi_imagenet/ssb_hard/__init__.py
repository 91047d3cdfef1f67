"""The `ssb_hard` TFDS builder: `ssb_hard_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
