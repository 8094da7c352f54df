#!/usr/bin/env bash
# The tuned-LR study of docs/RESULTS.md on a 2-core CPU: 8 optimizers at 5 LRs (0.25x..4x each optimizer's
# default, a 16x span) x 3 seeds, extended by up to two grid steps where an optimizer's best LR lies at an edge
# of the grid (--extend 2), then SPECTRA-AdamW's clip threshold c at its best LR. Two sweeps share the
# grid (--shard), one thread each; the second starts when the first has finished one run alone, so the
# step times of that run and of the later ones show what running side by side costs. Resumable: run it
# again after an interruption (finished runs are skipped, unfinished ones continue from their checkpoints).
#
#     bash scripts/cpu_study.sh [OUT] [STEPS]        # defaults: runs/study 100
set -euo pipefail
OUT=${1:-runs/study}
STEPS=${2:-100}
COMMON=(--steps "$STEPS" --seeds 0,1,2 --eval-every $((STEPS / 2)) --threads 1 --resume)
say() { echo "cpu_study: $* ($(date -u +%H:%M:%S) UTC)"; }

two_shards() {  # $1: folder, $2: first point's folder name, $3: passes, rest: sweep arguments
    # A shard stops where the next extension round needs the other shard's points, so the pair runs once
    # per round (--extend R: R + 1 passes; a pass with nothing left only reads the finished runs).
    local dir=$1 first=$2 passes=$3 pass p0 p1; shift 3
    mkdir -p "$dir"
    for pass in $(seq "$passes"); do
        spectrakit sweep "$@" "${COMMON[@]}" --out "$dir" --shard 0/2 >>"$dir/shard0.log" 2>&1 &
        p0=$!
        if [ "$pass" = 1 ]; then
            while [ ! -f "$dir/$first/run.json" ] && kill -0 "$p0" 2>/dev/null; do sleep 5; done
            say "first run of $dir finished alone; second shard starts"
        fi
        spectrakit sweep "$@" "${COMMON[@]}" --out "$dir" --shard 1/2 >>"$dir/shard1.log" 2>&1 &
        p1=$!
        wait "$p0" "$p1"
    done
    spectrakit sweep "$@" "${COMMON[@]}" --out "$dir" >"$dir/report.log" 2>&1  # all finished: the report
}

say "LR sweep of 8 optimizers into $OUT/lr"
two_shards "$OUT/lr" adamw-lr0.00075-s0 3 \
    --optimizers adamw,spectra-adamw,signum,spectra-signum,ademamix,spectra-ademamix,muon,dmuon \
    --lrs 0.25x,0.5x,1x,2x,4x --extend 2
BEST=$(python3 -c "import json, sys; b = json.load(open(sys.argv[1]))['best']; \
print([r['best_lr'] for r in b if r['optimizer'] == 'spectra-adamw'][0])" "$OUT/lr/sweep.json")
say "c sweep of spectra-adamw at its best LR $BEST into $OUT/c"
two_shards "$OUT/c" "adamw-lr${BEST}-s0" 1 --optimizers adamw,spectra-adamw --lrs "$BEST" --cs 1,3,10,30,100
say "done"
