"""The `imagenet_o` TFDS builder: `imagenet_o_dataset_builder.py`, its dummy data, checksums and
citation (docs/data.md)."""
