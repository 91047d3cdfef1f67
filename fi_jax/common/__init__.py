"""Stage 0, shared by every stage: the device mesh and multi-host helpers (`distributed`),
progress bars (`progress`), the `Outputs`/`Head` containers detectors consume (`outputs`) and
the column names of an extracted set (`columns`).

May import: nothing of fi_jax (only jax, numpy and the standard library).
"""
