#!/usr/bin/env bash
# Every code block of README.md and docs/*.md (docs/code_blocks.py): the check's own test
# on fixture pages (code_blocks_test.py), then the pages: each block marked, each
# `tested-by` claim holding, and each `run` block run (Python snippets as 2-rank jobs on
# Debian's python3 with torch, job configs through the C++ parser, shell lines).
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-onebit}"
py="${ONEBIT_VENVS:-/opt/onebit/venvs}/docs/bin/python"
[ -x "$py" ] ||
  { echo "FAIL: $py is missing: bash python/envs/setup.sh docs (deploy/install-deps.sh runs it)"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "FAIL: /usr/bin/python3 cannot import torch: deploy/install-deps.sh installs python3-torch"; exit 1; }
# One intra-op thread per PyTorch process: the jobs run several processes at once.
export OMP_NUM_THREADS=1
cd "${TEST_TMPDIR:?}"
"$py" "$root/docs/code_blocks_test.py" "$root"
exec "$py" "$root/docs/code_blocks.py" "$root" --run
