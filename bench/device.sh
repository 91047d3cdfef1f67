#!/usr/bin/env bash
# Extraction throughput on an accelerator: ViT-B/16 at 224 px and ResNet-50 (random weights),
# batch 256, bfloat16; prints images/s (input only, model only, end to end) and the model FLOP
# utilisation. The device's peak bf16 TFLOP/s is the first argument or $PEAK_TFLOPS
# (H100/H200 SXM dense bf16: 989).
#   bash bench/device.sh 989
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
PEAK="${1:-${PEAK_TFLOPS:-0}}"
IMAGES="${IMAGES:-4096}"
for model in vit_b16 resnet50; do
  echo "== $model"
  "$PY" bench/extract.py --model "$model" --size 224 --batch 256 --dtype bfloat16 \
      --images "$IMAGES" --peak_tflops "$PEAK"
done
