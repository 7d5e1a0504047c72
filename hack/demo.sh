#!/usr/bin/env bash
set -euo pipefail
echo "make demo: not yet (the local runner, issue 'datagen run', is in progress)"
