"""The reimagenet_noclass TFDS builder: ImageNet val images that ReImageNet assigns to no ImageNet-1k class."""
