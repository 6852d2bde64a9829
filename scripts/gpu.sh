#!/usr/bin/env bash
# Every GPU measurement of benchmarks/RESULTS.md, in parts that each fit one 10-minute device call.
#
#   scripts/gpu.sh PART OUT_DIR       PART: priority | second | ab | attention | attention-ab | sums | folds | tune | retune | gemms |
#                                           diagnose | regressions | tests | exactness | faults | engine | decode | anatomy |
#                                           prefill | kernels
#
#   priority   when one call may be all a session gets (session 12: an hour of failed starts), the open goals' runs
#              in 10 minutes: on a GPU the package's gemm table does not name, tune first (the runs after use the
#              table; it comes back in OUT_DIR); the GPU tests of the gemm configurations (the table's choices by
#              this GPU's name), of the state digests (the memo's kernel and engine, the copy that digests both ends,
#              against read-back digests) and of the ledger's read of them; the
#              ledger's rounds (tracked and read back) and the safeguards', then where the ledger's host time goes
#              (cProfile of a ledger run against one without: the functions it adds; then benchmarks/ledger_host_time.py:
#              the ledger's functions timed inside a run without a profiler's overhead)
#   second     what priority leaves, in the next call: tests/gpu whole, benchmarks/state_digests.py --device cuda
#              (a decode step's state digests at batch 32, tracked vs read back), the engine's defaults against
#              cuBLAS (batch 1 and 32, the roofline; no transformers run: `--hf-dtype` with no dtype; `decode` has it)
#   ab         the ledger's cost in this tree against each earlier tree under ab/ (scripts/ab_tree.sh REV exports one;
#              the call carries ab/): engine_throughput.py's base and ledger modes, trees alternating in separate
#              processes (two alternations of 6 rounds each, the second in reverse order: ABBA), then
#              ledger_host_time.py of each tree; their logs and JSON in OUT_DIR/ab.tgz (a device call brings back 8
#              files at most)
#   attention  the decode attention's kernel: its GPU tests, benchmarks/decode_attention.py's tiles and splits in this
#              tree (the launches alone), each tree's under ab/ if any (its default alone, in the same situations: this
#              tree's script with that tree's package), then tiles and splits ranked inside the engine's own batch-1
#              step (decode_anatomy.py --attention-tiles), which is what counts: session 32's H200 ranked a kernel
#              2.8-6.3x faster alone and 14 % slower in the engine
#   attention-ab  the engine with this tree's decode attention against each tree's under ab/, trees alternating in
#              separate processes, ABBA: benchmarks/decode_anatomy.py's batch-1 step (whole, and without attention) over
#              three rounds (contexts 68-371 tokens), then benchmarks/gpu_engine.py's batch 1 (the roofline, at 64-104
#              tokens); then the cold-vs-hit divergence of this tree (hit_divergence.py, 0.8B shape, bfloat16);
#              the logs and JSON in OUT_DIR/attention_ab.tgz
#   sums       a split gemm's K parts added by the residual's norm (EngineConfig.decode_split_sums="norm") against by a
#              second launch ("gemm"): the decode step's GPU tests (their bits the same, the gemm configurations with
#              the 8-part splits), the 0.8B's bfloat16 gemms ranked at batch 1 with the norm's sums (the mixer and down
#              projections' splits timed without a second launch) into OUT_DIR/tuned_b1.json, then in one process
#              benchmarks/gpu_engine.py's defaults, the defaults with the gemm's own sums, and the defaults with that
#              ranking (batch 1 and 32, the roofline; each row prints its runs' token digest: the first two must
#              agree); then the cold-vs-hit divergence with the defaults (hit_divergence.py, 0.8B shape, bfloat16)
#   folds      launches folded into their neighbours': the MLP's SiLU(gate) * up in the gate | up gemm's launch
#              (EngineConfig.decode_swiglu="gemm", the default), a GDN layer's output norm in its replay's
#              (decode_gdn="two"), a split gemm's parts added by the norm (decode_split_sums="norm", the default): the
#              decode step's GPU tests of them (the same bits as the launches they fold), then in one process
#              benchmarks/gpu_engine.py's defaults, the defaults with each fold undone or made, and the defaults
#              again (batch 1 and 32, the roofline; each row prints its runs' token digest: all must agree)
#   tune       scripts/tune_decode_gemms.py: this GPU's decode gemm choices (decode_gemm="tuned"), merged into a copy of the
#              package's table in OUT_DIR/tuned_gemms.json; copy it over mini_engine/ops/decode_rows/tuned_gemms.json, then
#              run tests to check the table on this GPU
#   retune     the 0.8B model's bfloat16 decode gemms ranked at batch 1 alone (scripts/tune_decode_gemms.py --batches 1,
#              each batch's times kept) into OUT_DIR/tuned_b1.json, then the engine's defaults with the package's table
#              against them (benchmarks/gpu_engine.py --gemm-table, one process, batch 1 and 32, the roofline). Run on
#              the H200 in session 29 (batch 1 954.4 against 896.7 tok/s): the packaged H200 table is that ranking now
#   gemms      the batch-1 gemm against the roofline: the gemm configurations' GPU test (the swapped tile by address,
#              by TMA descriptor, its splits summed in one launch, as programmatic dependent launches), then
#              benchmarks/decode_gemms.py --wide (each shape's gemm and the step's 97 in a CUDA graph: cuBLAS, the
#              decode gemm, its swapped tile, by TMA, by TMA with PDL (and asking the L2 for its weight first), splits
#              summed in one launch: do they take off the ~3 us a kernel costs in a graph?); the engine with each
#              weight's fastest (``decode_gemm="auto"``) is priority's last step
#
#   diagnose   the two measurements the open goals of issue 9 wait on, first: one ledger run of the 0.8B engine under
#              torch.profiler and cProfile (where the ledger's host time goes: 75 us a row on the H100, 28 % of the
#              run), and benchmarks/decode_gemms.py --wide (the step's 97 gemms timed in one CUDA graph as the
#              engine runs them, next to each alone, and a wider grid of Triton configurations: is batch 1 short
#              of the roofline by launches or by bandwidth?)
#
#   regressions  the GPU tests that failed on the H200 last (session 7) and their suspects, each run twice: a
#              sequence's bits alone and packed (the prefill walk's tile, fixed in c08cef3), the running copy
#              against the replay, the serial engine's hits with the reference decode (its failure says where
#              each differing hit parted from its cold run)
#   tests      tests/gpu (kernels against their references, the cuda device, the engine on cuda)
#   exactness  benchmarks/gpu_invariance.py, benchmarks/hit_divergence.py --device cuda (where each differing
#              hit parted from its cold run), one follow-up schedule on the sim and on the GPU and `hammer diff` of
#              the two (the first request whose tokens or logits differ, where its state parted), then
#              benchmarks/fault_mechanisms.py --device cuda (the GPU's own timing and two nemesis seeds)
#   faults     (ran out of an H100's memory in session 10, before the engines of finished rounds were freed:
#              rerun it next after diagnose) benchmarks/fault_mechanisms.py --device cuda at a production model's size (qwen3.5-0.8b-shaped-random,
#              bfloat16: donation clones of 19 MB a slot on the copy stream), the GPU's own timing and one nemesis
#              seed: do donate=transfer and metadata_fence=off fire on real streams without the nemesis? (--reply-stop :
#              makes the random model's follow-up replies stop, as donate=transfer needs: session 13)
#   engine     benchmarks/engine_throughput.py --device cuda on the 0.8B shape in bfloat16, six rounds (safeguards on
#              vs off, the ledger on, tracked and read back; the safeguards' and the ledger's own work priced), then
#              benchmarks/hit_divergence.py --device cuda (cold-vs-hit divergence), benchmarks/state_digests.py --device
#              cuda (a decode step's state digests at batch 32, tracked vs read back). The ledger's profile is in
#              diagnose.
#   decode     benchmarks/gpu_engine.py on the issue's model itself (Qwen3.5's 248,320-id vocabulary: the
#              1.6 GB roofline) in bfloat16 against transformers on the same weights, cuBLAS with plain launches against
#              the defaults (the tuned table's gemms, dependent launches on Hopper), then a batch-1 profile and timeline
#              (gzipped) of each
#   anatomy    benchmarks/decode_anatomy.py: where a graphed decode step's time goes (its graph replayed alone against
#              the engine's step; the step without its norms, SwiGLUs, GDN layers, attention, or all four), batch 1
#              and 32, with cProfile's table of the engine's host (session 31 on an H100: the gemms alone 66 % of the
#              batch-1 step, every other kernel class 34 %, 2 % outside the graph)
#   prefill    benchmarks/gpu_prefill.py (the engine's prefill and the model forward: the Triton kernels,
#              the Triton sequence ops with the tiled reference gemm, the references; a profile) and
#              benchmarks/triton_compiles.py (kernel variants compiled per new workload: none after the first)
#   kernels    benchmarks/gdn_kernels.py, benchmarks/small_kernels.py, benchmarks/decode_gemms.py (each batch-1
#              projection of the 0.8B model: cuBLAS on 64 and on 16 rows, its one-row path, the Triton decode gemm)
#              and benchmarks/decode_attention.py (the decode attention's tiles and splits in a graph)
#
# Runs from a plain checkout (PYTHONPATH, no install: the GPU machine has torch, triton, transformers
# and the harness's dependencies but not this package). Each step is bounded by `timeout` so a slow
# one cannot eat the next; logs and JSON land in OUT_DIR (flat: what a device call brings back).
set -uo pipefail
cd "$(dirname "$0")/.."
part="${1:?usage: scripts/gpu.sh priority|second|ab|attention|attention-ab|sums|folds|tune|retune|gemms|diagnose|regressions|tests|exactness|faults|engine|decode|anatomy|prefill|kernels OUT_DIR}"
out="${2:?usage: scripts/gpu.sh PART OUT_DIR}"
case "$part" in
    priority|second|ab|attention|attention-ab|sums|folds|tune|retune|gemms|diagnose|regressions|tests|exactness|faults|engine|decode|anatomy|prefill|kernels) ;;
    *) echo "gpu.sh: unknown part '$part' (priority | second | ab | attention | attention-ab | sums | folds | tune | retune | gemms | diagnose | regressions | tests | exactness | faults | engine |" \
            "decode | anatomy | prefill | kernels)" >&2
       exit 2 ;;
esac
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # (the ab part runs steps from other trees)
root="$PWD"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

step() {  # step SECONDS NAME COMMAND...: run, log to OUT_DIR/NAME.log, remember a failure
    local seconds=$1 name=$2
    shift 2
    timeout "$seconds" "$@" 2>&1 | tee "$out/$name.log" | tail -20
    local code=${PIPESTATUS[0]}
    [ "$code" -eq 0 ] || { echo "gpu.sh: $name exited $code"; status=1; }
}

# the A/B parts: this tree (.) and each earlier one exported under ab/ (scripts/ab_tree.sh REV; carry ab)
trees=(. ab/*/)
need_trees() {
    [ -d "${trees[1]}" ] || { echo "gpu.sh $part: no tree under ab/ (scripts/ab_tree.sh REV, and carry ab)" >&2; exit 2; }
}
tree_name() { if [ "$1" = . ]; then echo this; else basename "$1"; fi; }
round_order() {  # round_order ROUND: the trees, reversed in even rounds (ABBA): an H100 host has alternated fast and
    # slow processes, 1.5-1.7x apart (session 31), and a fixed order gives each tree the same processes' speed
    if [ $(($1 % 2)) = 1 ]; then printf '%s\n' "${trees[@]}"; else printf '%s\n' "${trees[@]}" | tac; fi
}
ab_step() {  # ab_step SECONDS TREE NAME SCRIPT ARGS...: a benchmark of TREE's, its own package on the path
    local seconds=$1 tree=$2 name=$3
    shift 3
    cd "$tree" && export PYTHONPATH="$PWD"
    step "$seconds" "$name" python3 "$@"
    cd "$root" && export PYTHONPATH="$root"
}

batch1_retune() {  # batch1_retune TUNE_SECONDS DECODE_SECONDS VARIANT...: the 0.8B's bfloat16 gemms ranked at batch 1
    # into OUT_DIR/tuned_b1.json, then gpu_engine.py's VARIANTs and the defaults with that table, in one process
    local tune=$1 decode=$2
    shift 2
    step "$tune" retune python3 scripts/tune_decode_gemms.py --models qwen3.5-0.8b-shaped-random --dtypes bfloat16 \
        --batches 1 --out "$out/tuned_b1.json"
    step "$decode" retune_decode python3 benchmarks/gpu_engine.py --variants "$@" --hf-dtype --vocab 248320 \
        --gemm-table "$out/tuned_b1.json" --out "$out/retune_decode.json"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
case "$part" in
    priority)
        # a GPU the package's table does not name yet is tuned first, into this checkout's table (the runs below
        # then use it; the table comes back in OUT_DIR, to be copied over mini_engine/ops/decode_rows/tuned_gemms.json)
        if ! python3 -c "import sys, torch; from mini_engine.ops.decode_rows import tuned
sys.exit(torch.cuda.get_device_name() not in tuned.load())"; then
            step 150 tune python3 scripts/tune_decode_gemms.py
            cp mini_engine/ops/decode_rows/tuned_gemms.json "$out/tuned_gemms.json"
        fi
        step 100 gpu_tests python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_step_cuda.py \
            tests/gpu/test_kernels_gpu.py tests/gpu/test_engine_cuda.py -k "decode or state or tracked or landed or ledger or checksum"
        step 300 throughput python3 benchmarks/engine_throughput.py --device cuda --shape 0.8b --dtype bfloat16 \
            --max-tokens 64 --repeats 5 --modes "copy, overlap" "copy, overlap, ledger" "copy, overlap, ledger read back" \
            "safeguards off, overlap" --profile "$out/ledger_profile.txt" --out "$out/engine_throughput_cuda_08b.json"
        sed -n '/against/,$p' "$out/ledger_profile.txt" | head -32 | cut -c1-150
        step 120 ledger_host_time python3 benchmarks/ledger_host_time.py --device cuda --shape 0.8b --dtype bfloat16 \
            --max-tokens 64 --repeats 3 --out "$out/ledger_host_time.json" ;;
    second)
        step 240 tests python3 -m pytest -q -p no:cacheprovider tests/gpu
        step 90 state_digests python3 benchmarks/state_digests.py --device cuda --batch 32 \
            --out "$out/state_digests_cuda.json"
        step 150 gpu_engine_default python3 benchmarks/gpu_engine.py --variants graphs-bf16 graphs-bf16-default \
            --hf-dtype --vocab 248320 --repeats 2 --out "$out/gpu_engine_default.json" ;;
    ab)
        need_trees
        for round in 1 2; do
            for tree in $(round_order "$round"); do
                name=$(tree_name "$tree")
                ab_step 100 "$tree" "ab_${name}_$round" benchmarks/engine_throughput.py --device cuda --shape 0.8b \
                    --dtype bfloat16 --max-tokens 64 --repeats 6 --modes "copy, overlap" "copy, overlap, ledger" \
                    --out "$out/ab_${name}_$round.json"
            done
        done
        for tree in "${trees[@]}"; do
            name=$(tree_name "$tree")
            ab_step 90 "$tree" "ab_host_$name" benchmarks/ledger_host_time.py --device cuda --shape 0.8b \
                --dtype bfloat16 --max-tokens 64 --repeats 2 --out "$out/ab_host_$name.json"
        done
        # a log and a JSON a step, 10 or more: the device tool brings back 8 files at most, so one archive of them
        (cd "$out" && tar czf ab.tgz ab_*.log ab_*.json && rm -f ab_*.log ab_*.json) ;;
    attention)
        step 150 attention_tests python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k paged_decode
        step 180 decode_attention python3 benchmarks/decode_attention.py --out "$out/decode_attention.json"
        for tree in "${trees[@]:1}"; do  # this tree's script, that tree's package
            [ -d "$tree" ] || continue
            name=$(tree_name "$tree")
            PYTHONPATH="$root/$tree" step 60 "decode_attention_$name" python3 benchmarks/decode_attention.py \
                --default-only --out "$out/decode_attention_$name.json"
        done
        step 200 attention_in_engine python3 benchmarks/decode_anatomy.py --batches 1 --classes whole attention \
            --repeats 3 --attention-tiles 32,4,2/128 32,8,2/256 64,8,1/256 16,4,2/256 \
            --out "$out/attention_in_engine.json" ;;
    attention-ab)
        need_trees
        for round in 1 2; do
            for tree in $(round_order "$round"); do
                name=$(tree_name "$tree")
                ab_step 100 "$tree" "anatomy_${name}_$round" benchmarks/decode_anatomy.py --batches 1 \
                    --classes whole attention --repeats 3 --out "$out/anatomy_${name}_$round.json"
            done
        done
        for round in 1 2; do
            for tree in $(round_order "$round"); do
                name=$(tree_name "$tree")
                ab_step 80 "$tree" "gpu_engine_${name}_$round" benchmarks/gpu_engine.py --variants graphs-bf16-default \
                    --hf-dtype --vocab 248320 --batches 1 --repeats 2 --out "$out/gpu_engine_${name}_$round.json"
            done
        done
        step 100 divergence python3 benchmarks/hit_divergence.py --device cuda --models qwen3.5-0.8b-shaped-random \
            --dtypes bfloat16 --requests 32 --max-tokens 12 --explain --out "$out/hit_divergence_cuda.json"
        (cd "$out" && tar czf attention_ab.tgz anatomy_* gpu_engine_* && rm -f anatomy_* gpu_engine_*) ;;
    tune)
        cp mini_engine/ops/decode_rows/tuned_gemms.json "$out/tuned_gemms.json"
        step 200 tune python3 scripts/tune_decode_gemms.py --out "$out/tuned_gemms.json" ;;
    sums)
        step 150 sums_tests python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_step_cuda.py
        batch1_retune 200 230 graphs-bf16-default graphs-bf16-gemm-sums
        step 120 sums_divergence python3 benchmarks/hit_divergence.py --device cuda --models qwen3.5-0.8b-shaped-random \
            --dtypes bfloat16 --requests 32 --max-tokens 12 --explain --out "$out/sums_hit_divergence.json" ;;
    folds)
        step 150 folds_tests python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_step_cuda.py \
            -k "silu_mul or gdn or split_gemms"
        step 240 folds_decode python3 benchmarks/gpu_engine.py --variants graphs-bf16-default \
            graphs-bf16-swiglu-rows graphs-bf16-gdn2 graphs-bf16-gemm-sums graphs-bf16-default \
            --hf-dtype --vocab 248320 --out "$out/folds_decode.json" ;;
    retune)
        batch1_retune 330 240 graphs-bf16-default ;;
    gemms)
        step 100 gemm_test python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_step_cuda.py
        step 460 decode_gemms python3 benchmarks/decode_gemms.py --wide --out "$out/decode_gemms.json" ;;
    diagnose)
        step 230 ledger_profile python3 benchmarks/engine_throughput.py --device cuda --shape 0.8b --dtype bfloat16 \
            --max-tokens 64 --repeats 1 --modes "copy, overlap, ledger" "copy, overlap" --profile "$out/ledger_profile.txt" \
            --out "$out/ledger_profile.json"
        grep -A30 "by tottime" "$out/ledger_profile.txt" | cut -c1-150
        step 330 decode_gemms python3 benchmarks/decode_gemms.py --wide --out "$out/decode_gemms.json" ;;
    regressions)
        for attempt in 1 2; do
            step 240 "regressions_$attempt" python3 -m pytest -q -p no:cacheprovider \
                "tests/gpu/test_gdn_triton_gpu.py::test_a_sequences_bits_do_not_depend_on_the_batch" \
                "tests/gpu/test_decode_step_cuda.py::test_the_running_copy_gives_the_replays_bits_on_the_gpu" \
                "tests/gpu/test_engine_cuda.py::test_greedy_hits_give_the_cold_runs_tokens_on_the_gpu"
        done ;;
    tests)
        step 540 tests python3 -m pytest -q -p no:cacheprovider tests/gpu ;;
    exactness)
        step 90 invariance python3 benchmarks/gpu_invariance.py --out "$out/gpu_invariance.json"
        step 120 divergence python3 benchmarks/hit_divergence.py --device cuda --requests 64 --max-tokens 12 --explain \
            --out "$out/hit_divergence_cuda.json"
        step 120 sim_vs_cuda bash -c 'for device in sim cuda; do python3 -m hammer run follow-up --count 16 --seed 3 \
            --model tiny-random --device $device --no-report --out "$0/runs_$device" > /dev/null; done
            python3 -m hammer diff "$0/runs_sim/last" "$0/runs_cuda/last"' "$out"
        step 400 mechanisms python3 benchmarks/fault_mechanisms.py --device cuda --requests 24 --device-seeds 0 1 2 \
            --out "$out/fault_mechanisms_cuda.json" ;;
    faults)
        step 560 mechanisms_08b python3 benchmarks/fault_mechanisms.py --device cuda --model qwen3.5-0.8b-shaped-random \
            --dtype bfloat16 --requests 24 --device-seeds 0 1 --reply-stop : \
            --out "$out/fault_mechanisms_cuda_08b.json" ;;
    engine)
        step 300 throughput python3 benchmarks/engine_throughput.py --device cuda --shape 0.8b --dtype bfloat16 \
            --max-tokens 64 --repeats 6 --modes "copy, overlap" "safeguards off, overlap" "copy, overlap, ledger" \
            "copy, overlap, ledger read back" \
            --out "$out/engine_throughput_cuda_08b.json"
        step 150 divergence python3 benchmarks/hit_divergence.py --device cuda --requests 64 --max-tokens 12 --explain \
            --out "$out/hit_divergence_cuda.json"
        step 90 state_digests python3 benchmarks/state_digests.py --device cuda --batch 32 \
            --out "$out/state_digests_cuda.json" ;;
    decode)
        step 360 gpu_engine_qwen_vocab python3 benchmarks/gpu_engine.py --variants graphs-bf16 graphs-bf16-default \
            --hf-dtype bfloat16 --vocab 248320 --out "$out/gpu_engine_qwen_vocab.json"
        step 200 gpu_engine_profile python3 benchmarks/gpu_engine.py --variants graphs-bf16 graphs-bf16-default \
            --hf-dtype --batches 1 --repeats 1 --long 16 --profile "$out/gpu_engine_profile.txt" --trace \
            --profile-batch 1 --out "$out/gpu_engine_b1.json"
        gzip -f "$out"/*.trace.json ;;
    anatomy)
        step 300 decode_anatomy python3 benchmarks/decode_anatomy.py --batches 1 32 --host-profile "$out/host_profile.txt" \
            --out "$out/decode_anatomy.json" ;;
    prefill)
        step 300 gpu_prefill python3 benchmarks/gpu_prefill.py --chunks 512 --repeats 2 \
            --profile "$out/gpu_prefill_profile.txt" --out "$out/gpu_prefill.json"
        step 240 triton_compiles python3 benchmarks/triton_compiles.py --out "$out/triton_compiles.json" ;;
    kernels)
        step 300 gdn_kernels python3 benchmarks/gdn_kernels.py --out "$out/gdn_kernels.json"  # fla: carry fla-core
        step 180 small_kernels python3 benchmarks/small_kernels.py --out "$out/small_kernels.json"
        step 100 decode_gemms python3 benchmarks/decode_gemms.py --out "$out/decode_gemms.json"
        step 120 decode_attention python3 benchmarks/decode_attention.py --out "$out/decode_attention.json" ;;
esac
exit $status
