"""Front end 2, the benchmark run: the command line (`cli`, `main.py`, the `fi-jax` script),
config validation (`validate`) and preflight checks (`preflight`), the model building
(`model`), the run itself (`benchmark`: model -> sets -> pipeline -> report files), the demo's
training (`train`), compile-ahead while it trains (`compile_ahead`), XLA's CPU options
(`xla_flags`) and JAX's persistent compilation cache (`jax_cache`).

May import: every stage, the evaluators excepted.
"""
