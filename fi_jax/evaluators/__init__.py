"""Front end 1: big_vision's evaluator API (`ood.Evaluator`), which runs the pipeline core
(fi_jax.pipeline) on the model being trained.

May import: every stage up to and including fi_jax.pipeline (not fi_jax.run).
"""
