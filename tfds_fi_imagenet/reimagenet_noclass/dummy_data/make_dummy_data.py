"""Writes this folder's dummy manual dir: a 10-image val tar and a reannotation.jsonl.

Run from the repository root:
  python tfds_fi_imagenet/reimagenet_noclass/dummy_data/make_dummy_data.py
The records use the forms tfds_fi_imagenet/reannotation.py reads (box entries with WordNet ids,
a class outside ImageNet-1k, no box, ambiguity as an attribute list and as an attribute dict).
Split: ood = val images 2, 3, 7 (no ImageNet-1k class); ambiguous = 4, 10; id = 1, 5, 6, 8, 9.
"""
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tfds_fi_imagenet import imagenet_val, testing


def records():
  wnids = imagenet_val.validation_wnids()
  for i in range(1, 11):
    rec = {"file_path": f"{wnids[i - 1]}/{imagenet_val.val_file_name(i)}"}
    box = {"label": wnids[i - 1], "bbox": [0.1, 0.1, 0.9, 0.9]}
    if i == 1:
      rec["boxes"] = [box, {"label": "n01440764", "bbox": [0.0, 0.0, 0.5, 0.5]}]
    elif i == 2:
      rec["boxes"] = []
    elif i in (3, 7):
      rec["boxes"] = [{"label": "hot air balloon" if i == 3 else "kiwi fruit",
                       "bbox": [0.2, 0.2, 0.8, 0.8]}]
    elif i == 4:
      rec["boxes"] = [{**box, "attributes": ["ambiguous"]}]
    elif i == 10:
      rec["boxes"] = [{**box, "attributes": {"ambiguous": True}}]
    else:
      rec["boxes"] = [box]
    yield rec


if __name__ == "__main__":
  testing.write_val_tar(HERE / "ILSVRC2012_img_val.tar", range(1, 11), size=16)
  (HERE / "reannotation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
