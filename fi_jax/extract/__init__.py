"""Stage 3, extraction: the one jitted, sharded forward step of a run (`forward`: features,
logits and the input scorers' columns per batch, rows fetched per process), the layer columns
of the layer detectors (`layer_columns`), the per-set feature cache with its manifests and
resumable shards (`cache`) and sets read from files instead of a model (`own_features`).

May import: fi_jax.common, fi_jax.data, fi_jax.models.
"""
