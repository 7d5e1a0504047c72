#!/usr/bin/env bash
# `make demo`: the quickstart run to success, then the seeds' mistake halted before any bulk work.
set -euo pipefail
cd "$(dirname "$0")/.."
datagen=".venv/bin/datagen"

echo "==> building the Kimi-K2-format stand-in tokenizer (cached)"
$datagen standin-tokenizer --out examples/models/kimi-k2-standin

rm -rf out/quickstart out/misconfigured
echo
echo "==> datagen run examples/quickstart.yaml"
$datagen run examples/quickstart.yaml

echo
echo "==> datagen run examples/misconfigured.yaml   (the seeds' mistake: --reasoning-parser kimi for a K2 model)"
if $datagen run examples/misconfigured.yaml; then
  echo "demo: the misconfigured run was expected to halt, but it succeeded" >&2
  exit 1
fi
bulk=$(find out/misconfigured -name '*.jsonl' -path '*/shards/*' 2>/dev/null | xargs -r cat | wc -l)
echo
echo "demo: the misconfigured run halted before bulk generation (${bulk} bulk records written). Demo OK."
echo
echo "The datagen command is $datagen: 'source .venv/bin/activate' puts it on PATH for the README's commands."
