#!/usr/bin/env python3
"""The README's workload-shape tables, from `slogate eval shapes-* --json`.

Usage: shapes_tables.py compare SHAPES.json    (tier off: each policy's VR
       mean/worst, then slogate minus least-loaded per seed, mean/worst)
       shapes_tables.py elastic SHAPES.json    (tier on: VR mean/worst and
       mean cost per policy)

deploy/figures.sh runs it on the files it writes.
"""
import json
import sys

CASE_WIDTH = 46


def aggregate(path):
    """{(row, metric): entry} of a multi-seed report."""
    report = json.load(open(path))
    return {(a["row"], a["metric"]): a for a in report["aggregate"]}, report


def cases(report):
    """The cases in report order, as the aggregate rows name them."""
    seen = []
    for a in report["aggregate"]:
        case = a["row"].rsplit("  ", 1)[0]
        if "−" not in a["row"] and not a["row"].startswith("mean Δ") and case not in seen:
            seen.append(case)
    return seen


def compare(path):
    rows, report = aggregate(path)
    policies = ["round-robin", "least-loaded", "spandana-central", "slogate"]
    print(f"{'case':{CASE_WIDTH - 1}} {'round-robin':>12} {'least-loaded':>13} {'spandana-cen':>13} {'slogate':>13}   slogate − least-loaded: VR   cost    timeouts")
    for case in cases(report):
        line = f"{case[:CASE_WIDTH - 2]:{CASE_WIDTH - 2}}"
        for policy in policies:
            vr = rows[(f"{case}  {policy}", "VR")]
            line += f"   {100 * vr['mean']:5.1f}/{100 * vr['worst']:5.1f}"
        diff = f"{case}  slogate − least-loaded"
        vr, cost, timeouts = rows[(diff, "VR")], rows[(diff, "cost")], rows[(diff, "timeouts")]
        line += f"   {100 * vr['mean']:+.1f}/{100 * vr['worst']:+.1f}pt  {cost['mean']:+.2f}/{cost['worst']:+.2f}  {timeouts['mean']:+.1f}/{timeouts['worst']:+.0f}"
        print(line)


def elastic(path):
    rows, report = aggregate(path)
    policies = ["least-loaded", "spandana", "spandana-central", "slogate"]
    print(f"{'case (VR mean/worst, cost mean)':{CASE_WIDTH - 2}}" + "".join(f"{p:>21}" for p in policies))
    for case in cases(report):
        line = f"{case[:CASE_WIDTH - 2]:{CASE_WIDTH - 2}}"
        for policy in policies:
            vr, cost = rows[(f"{case}  {policy}", "VR")], rows[(f"{case}  {policy}", "cost")]
            first = policy == policies[0]
            gap, width = ("     ", 4) if first else ("    ", 5)
            line += f"{gap}{100 * vr['mean']:{width}.1f}/{100 * vr['worst']:4.1f} ${cost['mean']:5.2f}"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("compare", "elastic"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    {"compare": compare, "elastic": elastic}[sys.argv[1]](sys.argv[2])
