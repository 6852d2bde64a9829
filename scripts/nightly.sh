#!/usr/bin/env bash
# The nightly job: a long clean soak, then the full fault matrix, with JUnit XML and reports as artefacts.
#
#   scripts/nightly.sh [OUT_DIR]        (default nightly/<UTC time>)
#
# Environment: SOAK_REQUESTS (default 12000 hammer requests: >= 10,000 cache hits at the default
# patterns' ~82% hit share), MATRIX_ARGS (default "--budget 30s": the whole catalogue, 30 s per cell),
# SEED (default: the date, so each night explores new schedules; a failure replays from its run
# directory).
# Exit: non-zero if the soak found corruption or the matrix missed or misattributed a fault; both
# parts always run, and everything they wrote stays under OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-nightly/$(date -u +%Y%m%dT%H%M%SZ)}"
seed="${SEED:-$(date -u +%Y%m%d)}"
mkdir -p "$out"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

hammer soak --requests "${SOAK_REQUESTS:-12000}" --seed "$seed" --out "$out/soak" \
    --junit "$out/soak-junit.xml" 2>&1 | tee "$out/soak.log"
soak=${PIPESTATUS[0]}

# shellcheck disable=SC2086  # MATRIX_ARGS is a list of options
hammer faults ${MATRIX_ARGS:---budget 30s} --seed "$seed" --out "$out/matrix" 2>&1 | tee "$out/matrix.log"
matrix=${PIPESTATUS[0]}

echo "nightly: soak exit $soak, matrix exit $matrix -> $out"
[ "$soak" -eq 0 ] && [ "$matrix" -eq 0 ]
