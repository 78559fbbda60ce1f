#!/usr/bin/env python3
"""The decision-quality summary a router change is judged by, in a minute.

Runs a `slogate` binary's evaluations and prints one line each:

- router-table2: slogate's VR and cost change against round-robin, mean
  and worst seed;
- the workload shapes: slogate's VR minus least-loaded's, summed over the
  cases, its worst case-seed, and the cost and timeout differences;
- `eval base`, warm and cold (`--cold`): slogate's VR minus least-loaded's
  over twenty seeds, mean and worst seed.

The development sets (the default) are what changes may be tuned on; the
held-out sets (`--held-out`: router-table2 on seeds 11..15,
shapes-held-out, base on seeds 101..120) are for the one check at the end.

Five seeds cannot tell a shape case's half point from noise; `--shape-seeds
1..40` runs the development shapes on more seeds (all development seeds:
the held-out shapes' seeds are 101..105, and stay fixed).

Usage: deploy/decision_summary.py [--held-out] [--binary PATH] [--cases] [--shape-seeds A..B]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(binary, args):
    """Runs `binary eval ARGS --json F` and returns the parsed report."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "report.json"
        done = subprocess.run([binary, "eval", *args, "--json", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"decision_summary: `slogate eval {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return json.loads(path.read_text())


def aggregate(report, row, metric):
    for figure in report["aggregate"]:
        if figure["row"] == row and figure["metric"] == metric:
            return figure
    sys.exit(f"decision_summary: no figure {metric!r} in row {row!r}")


def table2(binary, seeds):
    report = run(binary, ["router-table2", "--seeds", seeds, "--policies", "round-robin,least-loaded,slogate"])
    for policy in ["least-loaded", "slogate"]:
        row = f"mean Δ vs round-robin over cases  {policy}"
        vr, cost = aggregate(report, row, "VR Δ"), aggregate(report, row, "cost Δ")
        print(f"router-table2 {seeds} {policy:>12}: VR {vr['mean'] * 100:+.1f}% (worst {vr['worst'] * 100:+.1f}%, seed {vr['worst_seed']}), cost {cost['mean'] * 100:+.1f}%")


def shapes(binary, scenario, cases, seeds=None):
    report = run(binary, [scenario, "--policies", "least-loaded,slogate", *(["--seeds", seeds] if seeds else [])])
    suffix = "slogate − least-loaded"
    by_metric = {m: [f for f in report["aggregate"] if f["row"].endswith(suffix) and f["metric"] == m] for m in ["VR", "cost", "timeouts"]}
    vr = by_metric["VR"]
    label = f"{scenario} {seeds}" if seeds else scenario
    print(
        f"{label}: slogate − least-loaded VR {sum(f['mean'] for f in vr) * 100:+.1f} pt summed over {len(vr)} cases, "
        f"worst case-seed {max(f['worst'] for f in vr) * 100:+.1f} pt, cost ${sum(f['mean'] for f in by_metric['cost']):+.2f}, "
        f"timeouts {sum(f['mean'] for f in by_metric['timeouts']):+.1f}"
    )
    if cases:
        for f in vr:
            print(f"    {f['row'][: -len(suffix)].strip():60} {f['mean'] * 100:+.1f} pt (worst {f['worst'] * 100:+.1f})")


def base(binary, seeds, cold):
    report = run(binary, ["base", "--seeds", seeds, "--policies", "least-loaded,slogate", *(["--cold"] if cold else [])])
    case = "base(λ=0.1), κ=4, [16,16]"
    diff = aggregate(report, f"{case}  slogate − least-loaded", "VR")
    ours, theirs = aggregate(report, f"{case}  slogate", "VR"), aggregate(report, f"{case}  least-loaded", "VR")
    label = "cold" if cold else "warm"
    print(
        f"base {seeds} {label}: slogate {ours['mean'] * 100:.2f}%, least-loaded {theirs['mean'] * 100:.2f}%, "
        f"difference {diff['mean'] * 100:+.2f} pt (worst {diff['worst'] * 100:+.1f} pt, seed {diff['worst_seed']})"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", action="store_true", help="the held-out seeds and shapes instead of the development ones")
    parser.add_argument("--binary", default="target/release/slogate", help="the slogate binary (default: target/release/slogate)")
    parser.add_argument("--cases", action="store_true", help="also print each shape case")
    parser.add_argument("--shape-seeds", help="the development shapes' seeds, A..B (default: the scenario's 1..5)")
    args = parser.parse_args()
    if args.shape_seeds and args.held_out:
        print("decision_summary: --shape-seeds is for the development shapes; the held-out seeds stay fixed", file=sys.stderr)
        sys.exit(2)
    if not Path(args.binary).exists():
        print(f"decision_summary: no binary at {args.binary}; run `cargo build --release -p slogate`", file=sys.stderr)
        sys.exit(2)
    table2(args.binary, "11..15" if args.held_out else "1..5")
    shapes(args.binary, "shapes-held-out" if args.held_out else "shapes-dev", args.cases, args.shape_seeds)
    seeds = "101..120" if args.held_out else "1..20"
    base(args.binary, seeds, cold=False)
    base(args.binary, seeds, cold=True)


if __name__ == "__main__":
    main()
