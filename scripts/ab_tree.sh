#!/usr/bin/env bash
# Export an earlier revision's engine and benchmarks beside this checkout, for an A/B in one device call.
#
#   scripts/ab_tree.sh REV        writes ab/<REV>/ (mini_engine, benchmarks; ~8 MB), which .gitignore keeps out of
#                                 commits; a device call carries it: run(carry=["ab"]), then `scripts/gpu.sh ab OUT`
#
# The A/B runs the same benchmark from both trees in alternating processes (`gpu.sh ab`): across device calls the
# hosts differ by up to 1.4x, and within one their noise drifts, so old and new are only comparable side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: scripts/ab_tree.sh REV}"
commit="$(git rev-parse --short "$rev^{commit}")"
rm -rf "ab/$commit"
mkdir -p "ab/$commit"
git archive "$commit" -- mini_engine benchmarks | tar -x -C "ab/$commit"
echo "ab/$commit ($(du -sh "ab/$commit" | cut -f1)): carry [\"ab\"] to the device, then scripts/gpu.sh ab OUT_DIR"
