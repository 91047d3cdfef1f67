"""Front end 2, the benchmark run: the command line (`cli`, `main.py`, the `fi-jax` script;
`command`: the config-file reading it shares with the sweep), many models in one resumable,
shardable sweep (`sweep`, `python -m fi_jax.run.sweep`), config validation (`validate`) and
preflight checks (`preflight`), the model building (`model`), the run itself (`benchmark`:
model -> sets -> pipeline -> report files), the demo's training (`train`), compile-ahead while
it trains (`compile_ahead`), XLA's CPU options
(`xla_flags`), JAX's persistent compilation cache (`jax_cache`) and the workdir's folders
(`workdirs`: made by the run, never by a check).

May import: every stage, the evaluators excepted.
"""
