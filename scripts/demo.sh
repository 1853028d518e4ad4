#!/usr/bin/env bash
# `make demo`: the main job on the bundled examples, no cluster needed.
set -euo pipefail
cd "$(dirname "$0")/.."
ks=.venv/bin/kata-sizing
out="${DEMO_OUT:-build/demo}"
mkdir -p "$out"
for policy in examples/*.yaml; do
  name="$(basename "$policy" .yaml)"
  echo "== kata-sizing validate $policy"
  "$ks" validate "$policy"
  echo "== kata-sizing render $policy --node-capacity 256Gi --node-cpu 64 > $out/$name.yaml"
  "$ks" render "$policy" --node-capacity 256Gi --node-cpu 64 > "$out/$name.yaml"
  grep -E '^(kind|  name):' "$out/$name.yaml" | paste - - | sed 's/^/   /'
done
echo
echo "== drop-in for class m of examples/qemu-runtime-rs.yaml"
"$ks" render examples/qemu-runtime-rs.yaml -o json \
  | .venv/bin/python -c 'import json,sys; items=json.load(sys.stdin)["items"]; print(next(o for o in items if o["metadata"]["name"].endswith("-dropins"))["data"]["m.toml"])'
echo "== the worked examples (docs/sizing-model.md), class m of examples/measured-classes.yaml"
"$ks" explain examples/measured-classes.yaml --class m --cpu 1.5 --memory 600Mi
"$ks" explain examples/measured-classes.yaml --class m --memory 512Mi
"$ks" explain examples/measured-classes.yaml --class m --cpu 1.5
"$ks" explain examples/measured-classes.yaml --class m
echo
echo "== node guidance for a 256Gi node (qemu-runtime-rs)"
"$ks" render examples/qemu-runtime-rs.yaml --node-capacity 256Gi --node-cpu 64 -o json \
  | .venv/bin/python -c 'import json,sys; items=json.load(sys.stdin)["items"]; print(next(o for o in items if o["metadata"]["name"].endswith("-node-guidance"))["data"]["summary.txt"])'
echo "rendered objects are in $out/"
