#!/usr/bin/env bash
# Runs the GPU validation suite of this checkout (tests, linalg, optim, train, compare, conv) into one report
# folder: REPORT.md and report.json, plus each stage's files. Every argument goes to `spectrakit gpu-suite`:
#
#   scripts/gpu_suite.sh                                  # all stages on the GPU, report in gpu_report/
#   scripts/gpu_suite.sh --stage linalg --stage optim     # some stages (merged into the same report)
#   scripts/gpu_suite.sh --device cpu --tiny              # every stage at toy sizes on the CPU (seconds each)
#
# Each stage runs within a time budget (--budget, 420 s); a stage that fails is recorded in the report and the
# next stage still runs. The exit status is 1 when a stage failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m spectrakit gpu-suite "$@"
