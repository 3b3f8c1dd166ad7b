"""--query: ad-hoc SQL over the tables rounds, client_rounds, events, clients, privacy and runs, answered by DuckDB.

DuckDB reads the Arrow tables in place (no copy, no schema mapping) and speaks full SQL
(window functions, quantiles), so questions about long runs stay one statement. Every
table carries run, config and seed columns; `runs` has one row per run with its swept
keys as text columns (quote dotted names: "links.dropout.p").
"""

from __future__ import annotations

import pyarrow as pa

from analysis.load import STATIC_TABLES, TABLES, Dataset


class QueryError(ValueError):
    """A query that cannot be answered; the message is one line."""


def run_query(ds: Dataset, sql: str) -> pa.Table:
    try:
        import duckdb
    except ImportError:
        raise QueryError("--query needs duckdb (pip install duckdb)") from None
    con = duckdb.connect()
    for name in (*TABLES, *STATIC_TABLES, "runs"):
        con.register(name, ds.table(name))
    try:
        result = con.sql(sql)  # None for a statement that returns no rows
        return result.to_arrow_table() if result is not None else pa.table({})
    except duckdb.Error as e:
        raise QueryError(f"query failed: {str(e).splitlines()[0]}") from None


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_table(table: pa.Table) -> str:
    """Aligned plain-text rendering of a query result, numbers right-aligned, with a row count."""
    names = table.column_names
    cols = [[_cell(v) for v in table[n].to_pylist()] for n in names]
    numeric = [
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema
    ]
    widths = [max([len(n)] + [len(c) for c in col]) for n, col in zip(names, cols)]

    def line(cells):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)).rstrip()

    rows = [line(names), line(["-" * w for w in widths])]
    rows += [line(r) for r in zip(*cols)]
    rows.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(rows)
