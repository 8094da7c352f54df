#!/usr/bin/env bash
# The GPU checks of the compile-first work, for a lent GPU with little time: three parts, each under ~8 minutes on
# one H100, so that each fits one 10-minute command. Outputs go to $OUT (default gpu_compile_checks/).
#
#   bash benchmarks/gpu_compile_checks.sh 1   # GPU tests; compiled-vs-eager equality with the Newton-Schulz traced
#   bash benchmarks/gpu_compile_checks.sh 2   # first-compile times; eager step against torch's foreach/fused
#   bash benchmarks/gpu_compile_checks.sh 3   # the open items of the 2026-11-27 run (below)
#   bash benchmarks/gpu_compile_checks.sh 4   # the GPU tests, then part 3 in order of need (run 2026-11-27, 22:37)
#   bash benchmarks/gpu_compile_checks.sh 5   # first compiles with the multi-tensor moment updates (run as part of 6)
#   bash benchmarks/gpu_compile_checks.sh 6   # part 5, then the posts' compiled step timed in interleaved rounds
#                                             # (run 2026-11-28, 02:54: docs/BENCHMARKS.md)
#   bash benchmarks/gpu_compile_checks.sh 7   # the GPU tests, then step(grad_norm=) against the checked step
#
# Part 1: `pytest -m gpu tests/` (the compiled fused CUDA step with its float32 lr, the sync checks), then
# study_compile_equal.py with --trace-post, with and without cuBLAS's reduced-precision bf16 reductions (is Muon's
# compiled-vs-eager difference on CUDA in the Newton-Schulz inputs or in its products?).
# Part 2: bench_optim.py --parity-widths (AdamW/SGD against torch's foreach and fused, Lion/Signum against torch AdamW)
# first, on an idle host, then bench_compile.py (cold first compile of torch AdamW and the presets, fresh process each).
# Part 3: do the Frank-Wolfe posts compile on CUDA with inductor's loop reordering off (torch 2.11 asserts in it)?
# Is torch.optim.Muon's compiled CUDA step bit-identical to its eager one (ours differs by 5e-5 through the traced
# Nesterov lerp)? SpectraAdEMAMix's and SpectraMARS's first compile between two torch AdamW ones, on an idle host,
# with --phases (where each first compile went: tracing, AOT, lowering, fusion, Triton). First, on the idle host:
# where the plain presets' eager step spends its host time against torch's (study_step_host.py).
# Part 4: the GPU tests and part 3 in one command (~5 minutes on an H100). Part 5: since the moment updates of a
# traced step are multi-tensor operations (bases.foreach_lerp_), the first compiles of SpectraAdEMAMix,
# SpectraMARS, SpectraAdamW, AdEMAMix and MARS between two torch AdamW ones (part 4 measured SpectraAdEMAMix at
# 2.15x torch AdamW's CPU seconds before), the GPU tests, and compiled-vs-eager equality of the presets whose
# traced moment updates changed.
# Part 6 (~7 minutes): part 5, then the compiled-against-eager step of the nuclear Frank-Wolfe, linf_fw and
# hard-clip posts again, now timed in interleaved rounds (part 4 timed 20 compiled steps, then 20 eager ones:
# the nuclear post 1.42x, the hard clip 1.17x; on a CPU, on CUDA's code path and the posts' polar route,
# interleaved rounds give 0.96-1.05x), with the peak memory of a compiled and an eager step (the matrix
# transforms are an in-place operator since 2026-11-28: no second copy of the matrices in the compiled step).
# Part 7 (~5 minutes): the GPU tests (a norm given as a host number keeps the skip counter on the device), then
# the host time of the eager plain AdamW / SGD step with the check taken from the gradients' norm
# (`step(grad_norm=...)`, which skips the multi-tensor inf-norm that cost 206 us of host time per step on the H100)
# at d = 256, eager and compiled, and the parity rounds at d = 256 and 1024 with their norm rows.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_compile_checks}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TORCH_LOGS  # an empty TORCH_LOGS makes torch's logging set-up fail at import
part="${1:-}"
run() {  # name, command...: the command's output to $OUT/name.txt and the terminal, its exit status noted
    local name="$1"; shift
    echo "=== $name: $* ($(date -u +%H:%M:%S))"
    "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "=== $name: exit ${PIPESTATUS[0]} ($(date -u +%H:%M:%S))"
}
case "$part" in
1)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    run gpu_tests timeout 300 python -m pytest -q -m gpu tests/ -p no:cacheprovider
    run compile_equal timeout 90 python benchmarks/studies/study_compile_equal.py --device cuda --trace-post
    run compile_equal_exact timeout 60 python benchmarks/studies/study_compile_equal.py --device cuda --names Muon \
        --trace-post --exact-bf16-reductions
    ;;
2)
    run parity timeout 120 python benchmarks/bench_optim.py --device cuda --parity-widths 256,1024 --reps 25 \
        --no-write
    run compile_times timeout 330 python benchmarks/bench_compile.py --device cuda --width 256 --budget 300 \
        --names "torch AdamW,AdamW,SGD,SpectraAdamW,Lion"
    ;;
3)
    run step_host timeout 45 python benchmarks/studies/study_step_host.py --device cuda --width 256 --rounds 50
    run fw_no_loop_ordering timeout 160 python benchmarks/bench_compile.py --device cuda --width 256 --budget 110 \
        --names "SpectraSignum nuclear,SpectraSignum linf_fw" --inductor-config loop_ordering_after_fusion=False
    run compile_equal_muon timeout 150 python benchmarks/studies/study_compile_equal.py --device cuda \
        --names "torch Muon,Muon" --backends aot_eager,inductor
    run compile_times_3 timeout 200 python benchmarks/bench_compile.py --device cuda --width 256 --budget 150 \
        --names "torch AdamW,SpectraAdEMAMix,SpectraMARS,torch AdamW" --phases
    ;;
4)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    run gpu_tests timeout 90 python -m pytest -q -m gpu tests/ -p no:cacheprovider
    run compile_times_3 timeout 170 python benchmarks/bench_compile.py --device cuda --width 256 --budget 140 \
        --names "torch AdamW,SpectraAdEMAMix,SpectraMARS,torch AdamW" --phases
    run fw_no_loop_ordering timeout 120 python benchmarks/bench_compile.py --device cuda --width 256 --budget 100 \
        --names "SpectraSignum nuclear,SpectraSignum linf_fw" --inductor-config loop_ordering_after_fusion=False
    run step_host timeout 40 python benchmarks/studies/study_step_host.py --device cuda --width 256 --rounds 50
    run compile_equal_muon timeout 100 python benchmarks/studies/study_compile_equal.py --device cuda \
        --names "torch Muon,Muon" --backends aot_eager,inductor
    ;;
5)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    run compile_times_5 timeout 200 python benchmarks/bench_compile.py --device cuda --width 256 --budget 170 \
        --names "torch AdamW,SpectraAdEMAMix,SpectraMARS,SpectraAdamW,AdEMAMix,MARS,torch AdamW" --phases
    run gpu_tests timeout 80 python -m pytest -q -m gpu tests/ -p no:cacheprovider
    run compile_equal_5 timeout 100 python benchmarks/studies/study_compile_equal.py --device cuda \
        --names "SpectraAdamW,SpectraAdEMAMix,AdEMAMix,MARS,Lion,Signum" --backends aot_eager,inductor
    ;;
6)
    bash "$0" 5
    run posts_interleaved timeout 170 python benchmarks/bench_compile.py --device cuda --width 256 --budget 120 \
        --names "SpectraSignum nuclear,SpectraSignum linf_fw,SpectraAdamW hardcap" \
        --inductor-config loop_ordering_after_fusion=False
    ;;
7)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    run gpu_tests timeout 90 python -m pytest -q -m gpu tests/ -p no:cacheprovider
    run grad_norm_host timeout 150 python benchmarks/studies/study_grad_norm_host.py --device cuda --width 256 --rounds 101 \
        --compile
    run parity timeout 150 python benchmarks/bench_optim.py --device cuda --parity-widths 256,1024 --reps 25 \
        --no-write
    ;;
*)
    echo "usage: bash benchmarks/gpu_compile_checks.sh 1|2|3|4|5|6|7" >&2
    exit 2
    ;;
esac
