#!/usr/bin/env bash
# Build the FGD authors' simulator (hkust-adsl/kubernetes-scheduler-simulator, the commit our
# simulator cites: 8f3d641) from a clone of it and run its FGD and BestFit policies on an openb pod
# list at their paper's setting (tune ratio 1.3, shuffled arrivals), one seed each, then their own
# analysis (value at x % arrived = mean over the samples whose arrived percent rounds to x).
#
#   git clone https://github.com/hkust-adsl/kubernetes-scheduler-simulator SRC && git -C SRC checkout 8f3d641
#   hack/fgd-authors-simulator.sh SRC [SEED ...]          # default seed 42; POLICIES="FGD BestFit"
#
# Needs Go (1.26 builds the vendored tree unchanged), python3 with pandas and pyyaml for their
# scripts. One run takes ~40 minutes and ~4 GB on one core here (their README says ~10 minutes).
# Prints their allocation rate at 100 % and 130 % arrived per policy; compare with
#   gpuplace simulate --trace openb --pods .../openb_pod_list_default.csv --baselines fgd,bestfit \
#       --load 1.0,1.3 --seed SEED --repeats 1
set -euo pipefail
SRC=$(cd "${1:?usage: $0 SRC [SEED ...]}" && pwd); shift
SEEDS=${*:-42}
POLICIES=${POLICIES:-"FGD BestFit"}
LIST=${LIST:-openb_pod_list_default}
cd "$SRC"
export GOFLAGS=-mod=vendor GOTOOLCHAIN=local
[ -x bin/simon ] || go build -o bin/simon ./cmd        # what their Makefile does
if [ ! -f "data/$LIST/$LIST.yaml" ]; then               # data/prepare_input.sh, for one list
  (cd data && mkdir -p "$LIST" && cp node_yaml/openb_node_list_gpu_node.yaml "$LIST"/ && python3 pod_csv_to_yaml.py "csv/$LIST.csv")
fi
for SEED in $SEEDS; do
  for POL in $POLICIES; do
    case $POL in  # the lines experiments/run_scripts/generate_run_scripts.py writes
      FGD)     DIR=06-FGD;     ARGS="-FGD 1000 -gpusel FGD -dimext share -norm max" ;;
      BestFit) DIR=05-BestFit; ARGS="-BestFit 1000" ;;
      *) echo "unknown policy $POL (FGD or BestFit)" >&2; exit 2 ;;
    esac
    EXP="experiments/2023_0511/$LIST/$DIR/1.3/$SEED"
    [ -f "$EXP/analysis_allo.csv" ] && continue
    mkdir -p "$EXP" && touch "$EXP/terminal.out"
    # shellcheck disable=SC2086
    python3 scripts/generate_config_and_run.py -d "$EXP" -e -b -f "data/$LIST" $ARGS \
      -tune 1.3 -tuneseed "$SEED" --shuffle-pod=true -z "$EXP/snapshot/ds01" >> "$EXP/terminal.out"
    python3 scripts/analysis.py -f -g "$EXP" >> "$EXP/terminal.out"
  done
done
(cd experiments && ln -sfn 2023_0511 data && cd analysis && python3 merge_alloc_discrete.py > /dev/null)
python3 - "$SRC/experiments/analysis/analysis_results/analysis_allo_discrete.csv" "$LIST" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("workload") == sys.argv[2]]
for r in rows:
    print(f"{r['workload']} seed {r['seed']} {r['sc_policy']}: {r['100']} % at 100 % arrived, {r['130']} % at 130 %")
PY
