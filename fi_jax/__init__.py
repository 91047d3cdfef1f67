"""fi_jax: OOD detection with ImageNet-1k as in-distribution, in JAX/Flax.

The packages are the pipeline's stages, in this order (docs/architecture.md); a module imports
only from its own stage or an earlier one (tests/test_layout.py):

  common -> data -> models -> extract -> detectors -> metrics -> report -> pipeline
  -> evaluators (big_vision's evaluator API) | run (the CLI, the benchmark run)

`fi_jax.pipeline` is the one core both front ends call.
"""
