"""The `openimage_o` TFDS builder: `openimage_o_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
