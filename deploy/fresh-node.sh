#!/usr/bin/env bash
# A fresh node's first live run, per policy and seed: `slogate serve` on
# the embedded warehouse (two 16-RPU clusters, 600x, an empty data
# directory) and `slogate-loadgen` replaying BaseWorkload (λ = 0.1, κ = 4)
# against it. Prints each run's VR and cost.
# Usage: deploy/fresh-node.sh [seeds] [policies]   (default: "1 2 3 4 5" "least-loaded slogate")
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3 4 5"}
policies=${2:-"least-loaded slogate"}
cargo build --release -p slogate -p slogate-loadgen >&2
for seed in $seeds; do
  for policy in $policies; do
    dir=$(mktemp -d)
    cat > "$dir/node.toml" <<EOT
version = "1"
[node]
grpc_addr = "127.0.0.1:0"
admin_addr = "127.0.0.1:0"
data_dir = "$dir/data"
time_compression = 600.0
seed = $seed
[[pool]]
name = "default"
policy = "$policy"
clusters = [16, 16]
EOT
    ./target/release/slogate serve --config "$dir/node.toml" > "$dir/out" 2> "$dir/err" &
    pid=$!
    for _ in $(seq 1 100); do grep -q 'Listening' "$dir/err" && break; sleep 0.1; done
    grpc=$(grep -o 'grpc_addr=[0-9.:]*' "$dir/err" | head -1 | cut -d= -f2)
    admin=$(grep -o 'admin_addr=[0-9.:]*' "$dir/err" | head -1 | cut -d= -f2)
    report=$(./target/release/slogate-loadgen run --target "http://$grpc" --admin "$admin" --workload base \
      --rate 0.1 --kappa 4 --seed "$seed" --time-scale 600 --deadline-s 120 2>/dev/null)
    vr=$(grep -o 'violation rate [0-9.]*%' <<<"$report" | cut -d' ' -f3)
    cost=$(grep -o 'cost \$[0-9.]*' <<<"$report" | cut -d' ' -f2)
    echo "seed $seed  $policy  VR $vr  cost $cost"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
  done
done
