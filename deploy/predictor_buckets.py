#!/usr/bin/env python3
"""Summarises `slogate eval predictor-sim --json PATH` reports the way the
README quotes them.

For each predictor other than concurrency-aware, per report:

- the size x concurrency buckets where it is at or below concurrency-aware
  on p50, p90 and p95 alike (each percentile averaged over the seeds), and
  the buckets where it is not;
- the same count per seed;
- the geometric means of its p50, p90 and p95 over the buckets, each
  bucket weighted by its executions over all seeds (concurrency-aware's
  on the same buckets and weights beside it).

    cargo run --release --features learn -- eval predictor-sim --seeds 1..5 --json sim.json
    python3 deploy/predictor_buckets.py sim.json

Bad input (a missing file, or JSON that is not such a report) exits with
code 2 and a message naming the file.
"""

import argparse
import collections
import json
import math
import sys

BASELINE = "concurrency-aware"
PERCENTILES = ("p50", "p90", "p95")


def load(path):
    """Per (predictor, rpu, bucket): the seeds' mean of each percentile,
    the executions over all seeds, and per seed the percentiles."""
    try:
        with open(path) as f:
            report = json.load(f)
        per_seed = report["per_seed"]
        rows = [row for seed in per_seed for row in seed]
        for row in rows:
            row["predictor"], row["rpu"], row["bucket"], row["rows"]
            for p in PERCENTILES:
                float(row["q_error"][p])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{path}: not a `slogate eval predictor-sim --json` report: {e!r}", file=sys.stderr)
        sys.exit(2)
    sums = collections.defaultdict(lambda: collections.defaultdict(list))
    executions = collections.Counter()
    for row in rows:
        key = (row["predictor"], row["rpu"], row["bucket"])
        for p in PERCENTILES:
            sums[key][p].append(row["q_error"][p])
        executions[key] += row["rows"]
    means = {key: {p: sum(v) / len(v) for p, v in by_p.items()} for key, by_p in sums.items()}
    return means, executions, per_seed


def at_or_below(errors, baseline):
    return all(errors[p] <= baseline[p] + 1e-12 for p in PERCENTILES)


def geometric_means(means, predictor, buckets, weight_of):
    total = 0
    logs = collections.defaultdict(float)
    for bucket in buckets:
        errors = means.get((predictor,) + bucket)
        if errors is None:
            continue
        weight = weight_of(bucket)
        total += weight
        for p in PERCENTILES:
            logs[p] += weight * math.log(errors[p])
    return "/".join(f"{math.exp(logs[p] / total):.2f}" for p in PERCENTILES) if total else "-"


def summarise(path):
    means, executions, per_seed = load(path)
    buckets = sorted(
        {key[1:] for key in means if key[0] == BASELINE},
        key=lambda b: (b[0], int(b[1].split("-")[0].rstrip("+"))),
    )
    predictors = sorted({key[0] for key in means if key[0] != BASELINE})
    print(f"{path}: {len(per_seed)} seeds, {len(buckets)} buckets")
    for predictor in predictors:
        scored = [b for b in buckets if (predictor,) + b in means]
        wins = [b for b in scored if at_or_below(means[(predictor,) + b], means[(BASELINE,) + b])]
        losses = [f"{rpu}/{bucket}" for rpu, bucket in scored if (rpu, bucket) not in wins]
        seed_wins = []
        for seed in per_seed:
            q = {(r["predictor"], r["rpu"], r["bucket"]): r["q_error"] for r in seed}
            base = {k[1:]: v for k, v in q.items() if k[0] == BASELINE}
            seed_wins.append(sum(1 for b, v in base.items() if (predictor,) + b in q and at_or_below(q[(predictor,) + b], v)))
        weight_of = lambda b, predictor=predictor: executions[(predictor,) + b]
        print(f"  {predictor:20} at or below {BASELINE} in {len(wins)} of {len(scored)} buckets"
              f" (per seed {min(seed_wins)}-{max(seed_wins)});"
              f" geometric means {geometric_means(means, predictor, scored, weight_of)}"
              f" against {geometric_means(means, BASELINE, scored, weight_of)}")
        if losses:
            print(f"  {'':20} above in: {' '.join(losses)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="`slogate eval predictor-sim --json` outputs")
    args = parser.parse_args()
    for path in args.reports:
        summarise(path)


if __name__ == "__main__":
    main()
