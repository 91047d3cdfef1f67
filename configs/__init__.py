"""The bundled ml_collections configs: `get_config(arg=None)` per file, `python main.py
--config=configs/<name>.py[:arg]`; `common.py` holds what they share (set specs, detector
lists, argument parsing).
"""
