#!/usr/bin/env python3
"""Submit one query to a slogate node with Python's grpcio.

    pip install grpcio grpcio-tools
    python3 deploy/clients/submit.py --target 127.0.0.1:50051 --pool tpcds \
        --sql "SELECT count(*) FROM store_sales" --slo-ms 2000

It compiles slogate's proto (proto/proto/slogate/v1/gateway.proto) with
grpcio-tools into a temporary directory, sends one Submit, and prints the
reply as JSON: status, target, latency, SLO met, rows (for SQL backends)
and the SQLSTATE of a failed query. Give --template N instead of --sql for
a named template. It exits 1 when the call fails, with the gRPC status.
"""

import argparse
import json
import os
import sys
import tempfile


def compile_proto(out):
    from grpc_tools import protoc
    import grpc_tools

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto", "proto")
    includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    status = protoc.main(
        ["protoc", f"-I{root}", f"-I{includes}", f"--python_out={out}", f"--grpc_python_out={out}", os.path.join(root, "slogate", "v1", "gateway.proto")]
    )
    if status != 0:
        sys.exit(f"submit.py: protoc failed on {root}")
    sys.path.insert(0, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--pool", default="")
    query = parser.add_mutually_exclusive_group(required=True)
    query.add_argument("--sql")
    query.add_argument("--template", type=int)
    parser.add_argument("--slo-ms", type=int, required=True)
    parser.add_argument("--query-id", default="")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()

    import grpc

    with tempfile.TemporaryDirectory() as out:
        compile_proto(out)
        from slogate.v1 import gateway_pb2, gateway_pb2_grpc

        request = gateway_pb2.SubmitRequest(pool=args.pool, query_id=args.query_id, slo_ms=args.slo_ms)
        if args.sql is not None:
            request.sql = args.sql
        else:
            request.template = args.template
        with grpc.insecure_channel(args.target) as channel:
            try:
                reply = gateway_pb2_grpc.GatewayStub(channel).Submit(request, timeout=args.timeout_s)
            except grpc.RpcError as error:
                print(json.dumps({"error": error.code().name, "details": error.details()}))
                sys.exit(1)
        rows = [list(row.values) for row in reply.result.rows]
        print(
            json.dumps(
                {
                    "status": gateway_pb2.QueryStatus.Name(reply.status),
                    "target": reply.target,
                    "latency_ms": reply.latency_ms,
                    "slo_met": reply.slo_met,
                    "columns": list(reply.result.columns),
                    "rows": rows,
                    "truncated": reply.result.truncated,
                    "sqlstate": reply.sqlstate,
                    "explanation": reply.explanation,
                }
            )
        )


if __name__ == "__main__":
    main()
