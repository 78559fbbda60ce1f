#!/usr/bin/env python3
"""TPC-DS data and queries for slogate's PostgreSQL testbed, generated offline.

DuckDB's TPC-DS extension (PyPI `duckdb==1.4.4` with `duckdb-ext-tpcds`)
generates the data (`dsdgen`) and the 99 query texts in DuckDB's dialect;
this script writes what `slogate demo --backend postgres` loads:

    OUT/schema.sql        CREATE TABLE for the 24 tables, PostgreSQL types
    OUT/data/<table>.csv  the rows (CSV, header, empty field = NULL)
    OUT/queries/<N>.sql   the 99 queries
    OUT/manifest.json     scale factor, row counts, versions

Usage: generate.py --sf 0.1 --out DIR. It writes DIR/manifest.json last, so
a directory with a manifest is complete. Nothing is downloaded: the
extension ships inside the PyPI package.

The query texts need no port: all 99 of DuckDB's texts parse and run on
PostgreSQL 15 as they are (measured at SF 0.1; see the README for which
are slow there).
"""

import argparse
import glob
import json
import os
import sys


def load_extension(con):
    import duckdb_ext  # noqa: F401  (the package that carries the extension file)

    # duckdb_ext is a namespace package: its directories are its __path__.
    found = []
    for root in duckdb_ext.__path__:
        found += glob.glob(os.path.join(root, "extensions", "*", "*", "tpcds.duckdb_extension"))
    if not found:
        sys.exit("generate.py: no tpcds.duckdb_extension in the duckdb-ext-tpcds package")
    con.execute(f"LOAD '{found[0]}'")


def pg_type(duck_type):
    t = duck_type.upper()
    if t.startswith("DECIMAL"):
        return t.replace("DECIMAL", "numeric")
    return {"VARCHAR": "varchar", "INTEGER": "integer", "BIGINT": "bigint", "DATE": "date", "DOUBLE": "double precision"}[t]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=0.1, help="TPC-DS scale factor (default 0.1)")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args()
    try:
        import duckdb
    except ImportError:
        sys.exit("generate.py: needs PyPI duckdb==1.4.4 and duckdb-ext-tpcds (pip install duckdb==1.4.4 duckdb-ext-tpcds)")

    os.makedirs(os.path.join(args.out, "data"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "queries"), exist_ok=True)
    con = duckdb.connect()
    load_extension(con)
    con.execute(f"CALL dsdgen(sf={args.sf})")

    tables = sorted(r[0] for r in con.execute("SHOW TABLES").fetchall())
    schema = []
    counts = {}
    for table in tables:
        columns = con.execute(f"DESCRIBE {table}").fetchall()
        body = ",\n  ".join(f"{name} {pg_type(kind)}" for name, kind, *_ in columns)
        schema.append(f"CREATE TABLE {table} (\n  {body}\n);\n")
        path = os.path.join(args.out, "data", f"{table}.csv")
        con.execute(f"COPY {table} TO '{path}' (HEADER, DELIMITER ',')")
        counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    with open(os.path.join(args.out, "schema.sql"), "w") as f:
        f.write("\n".join(schema))

    queries = con.execute("SELECT query_nr, query FROM tpcds_queries() ORDER BY query_nr").fetchall()
    for number, text in queries:
        with open(os.path.join(args.out, "queries", f"{number}.sql"), "w") as f:
            f.write(text.strip() + "\n")

    manifest = {"scale_factor": args.sf, "tables": counts, "queries": len(queries), "duckdb": duckdb.__version__}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"generate.py: {len(tables)} tables, {sum(counts.values())} rows, {len(queries)} queries in {args.out}")


if __name__ == "__main__":
    main()
