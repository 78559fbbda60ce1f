#!/usr/bin/env bash
# Regenerates every evaluation figure the README quotes: each built-in
# evaluation over its default seeds (five; the held-out shapes on their
# own seeds 101..105), as text and JSON under target/figures/.
# Usage: deploy/figures.sh [evaluation ...]   (default: all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p slogate
out=target/figures
mkdir -p "$out"
all=(base router-table2 shapes-dev shapes-held-out size-table3 trigger-table4 planner-fidelity tuner-table5 e2e-diurnal bursty-service predictor-sim)
evaluations=("${@:-${all[@]}}")
for evaluation in "${evaluations[@]}"; do
  echo "figures: $evaluation" >&2
  ./target/release/slogate eval "$evaluation" --json "$out/$evaluation.json" > "$out/$evaluation.txt"
  if [ "$evaluation" = base ]; then
    # A fresh node in simulation: the learned policies from priors.
    ./target/release/slogate eval base --cold --seeds 1..20 --policies least-loaded,slogate --json "$out/base-cold.json" > "$out/base-cold.txt"
    ./target/release/slogate eval base --cold --seeds 101..120 --policies least-loaded,slogate --json "$out/base-cold-held-out.json" > "$out/base-cold-held-out.txt"
    ./target/release/slogate eval router-table2 --cold --policies round-robin,least-loaded,slogate --json "$out/router-table2-cold.json" > "$out/router-table2-cold.txt"
  fi
  if [ "$evaluation" = router-table2 ]; then
    ./target/release/slogate eval router-table2 --elastic on --json "$out/router-table2-elastic.json" > "$out/router-table2-elastic.txt"
    # The overload reserve, on the default seeds and on seeds 11..15.
    reserve=round-robin,least-loaded,slogate,slogate-reserve
    ./target/release/slogate eval router-table2 --policies "$reserve" --json "$out/router-table2-reserve.json" > "$out/router-table2-reserve.txt"
    ./target/release/slogate eval router-table2 --policies "$reserve" --seeds 11..15 --json "$out/router-table2-reserve-11-15.json" > "$out/router-table2-reserve-11-15.txt"
  fi
  if [ "$evaluation" = trigger-table4 ]; then
    ./target/release/slogate eval trigger-table4 --seeds 11..15 --json "$out/trigger-table4-11-15.json" > "$out/trigger-table4-11-15.txt"
  fi
  if [ "$evaluation" = shapes-dev ] || [ "$evaluation" = shapes-held-out ]; then
    ./target/release/slogate eval "$evaluation" --policies least-loaded,slogate,slogate-reserve --json "$out/$evaluation-reserve.json" > "$out/$evaluation-reserve.txt"
    # The README's tables ("Held-out workloads").
    python3 deploy/shapes_tables.py compare "$out/$evaluation.json" > "$out/$evaluation-table.txt"
  fi
  if [ "$evaluation" = shapes-held-out ]; then
    ./target/release/slogate eval shapes-held-out --elastic on --json "$out/shapes-held-out-elastic.json" > "$out/shapes-held-out-elastic.txt"
    python3 deploy/shapes_tables.py elastic "$out/shapes-held-out-elastic.json" > "$out/shapes-held-out-elastic-table.txt"
  fi
done
echo "figures: written to $out" >&2
