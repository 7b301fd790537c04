#!/usr/bin/env bash
# The default model's scores on the benchmark domains (real execution; rehearsal fidelity where the benchmark
# executes calls), one JSON per domain under runs/bench_eval/. Needs `make benchmarks`. Domains already
# scored are skipped, so an interrupted run resumes. The table in docs/results.md comes from these files.
set -u
cd "$(dirname "$0")/.."
out_dir=runs/bench_eval
mkdir -p "$out_dir"
for spec in "bfcl:simple_python 20" "bfcl:multiple 20" "bfcl:parallel 20" "bfcl:parallel_multiple 20" \
            "bfcl:live_simple 20" "bfcl:irrelevance 20" "bfcl:multi_turn_base 3" "tau2:retail 5" "tau2:airline 5"; do
  set -- $spec
  out="$out_dir/${1/:/_}.json"
  [ -f "$out" ] && continue
  echo "== $1 ($2 test tasks) start $(date +%T)"
  .venv/bin/envace eval --domain "$1" --num-tasks "$2" --max-new-tokens 128 --out "$out"
  echo "   end $(date +%T)"
done
