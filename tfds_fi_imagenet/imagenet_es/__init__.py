"""The imagenet_es TFDS builder: ImageNet-ES (camera-captured covariate shift), its dummy data and citation (docs/data.md)."""
