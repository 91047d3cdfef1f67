"""A run's default model label: short, stable and safe to type in a shell.

The label names the model in every report row, in `report compare` (`--pair LABEL:DETECTOR`)
and in a sweep's folders. The rule (`short_label`): the config's name and the model it was
given, joined with '-'; a '/' inside a part is dropped (`B/16` -> `B16`) and any other
character outside letters, digits, '.', '_' and '-' becomes '-' (`L/14@336` -> `L14-336`); a
part that already begins with the previous one is not repeated (`siglip2` + `siglip2_b16_224`
-> `siglip2_b16_224`). So `configs/vit.py:variant=B/16` is `vit-B16` and
`configs/clip.py:name=openai-B/16` is `clip-openai-B16`. The checkpoint file is not part of
the label (results.json's `meta.checkpoint` records it); `config.model_label` sets any label.
No JAX here: the configs use it.
"""
from __future__ import annotations

import re

RANDOM_INIT_SUFFIX = "-random-init"


def _clean(part: str) -> str:
  return re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]", "-", part.replace("/", ""))).strip("-")


def short_label(*parts: str) -> str:
  """`parts` (the config's name, then the model: variant, checkpoint name, ...) as one label
  by the module's rule; empty parts are left out."""
  out: list[str] = []
  for part in filter(None, (_clean(str(p)) for p in parts)):
    if out and part.lower().startswith(out[-1].lower()):
      out[-1] = part
    else:
      out.append(part)
  return "-".join(out)
