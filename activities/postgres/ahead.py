"""Mode Online: tables compared before the freeze, so that the write-downtime window reads only what changed since.

A full verify reads every row of both sides. In mode Online the copy is done before the
freeze, so reading every row after it would make the writes' downtime grow with the
database (about 25 s per GB here). So replicate, once the target is nearly caught up and
while the source still takes writes, compares the tables already, and verify, writes
stopped, reads again only the tables either side has written since. Every row of every
table is still compared: before the freeze for the tables nothing wrote since, after it
for the others.

How replicate compares ahead (`compare`), in this order:
1. it reads, on the source, each table's count of rows inserted, updated and deleted
   (pg_stat_user_tables), its relfilenode and the digest of its columns, and when the
   statistics were last reset;
2. it reads where the source's WAL ends, and waits until the target has applied
   everything up to there: all that was committed on the source before step 1 is then on
   the target;
3. it reads the same counts on the target;
4. it reads the checksums of the tables on both sides (see checksums), at once.
A table whose checksums are equal is recorded with the six marks (two counts, two
relfilenodes, two column digests), the largest tables first, up to TABLES_AHEAD (the record goes into the
workflow's history, which must stay small).

How verify uses it (`vouched`): once the source is frozen and catch-up has ended the
replication, it ends the target's other sessions and reads both sides' marks again. A
recorded table whose six marks are all unchanged, on sides whose statistics were not
reset since, is taken as compared; every other table is read again.

Some DDL changes every row's value without moving either mark: ADD COLUMN with a default
the server evaluates once (a "fast default", e.g. `DEFAULT now()`) rewrites no row and keeps
the relfilenode, yet each side's rows read that side's own value (attmissingval), and both
schemas still describe the column as `default now()`. So each side's marks also hold a
digest of the table's columns as its catalog holds them (`COLUMNS`: names, types,
defaults, the fast default's value), and a table whose digest moved on either side is read
again, as is one recorded without digests (by an older worker).

Why that is exact. The counts move for every insert, update, delete and COPY into the
table, committed or rolled back; TRUNCATE and rewrites (VACUUM FULL, CLUSTER) change the
relfilenode instead; a reset of any table's statistics changes the database's reset time
(see fencing, whose mark rests on the same counters). A backend may hold its counts until
it flushes them, but it always flushes when it exits: the freeze ended every session of
the source (so every write before the freeze is counted when verify reads), and verify
ends the target's, while catch-up's end of the replication stopped its apply worker. So
a count that has not moved means that nothing wrote the table since step 1 (source) or
step 3 (target). On the source, the table then held the same rows from step 1 to the
freeze, those read at step 4. On the target, everything committed on the source before
step 1 had arrived before step 3, nothing reached the table after (the source did not
write it), and nothing else wrote it. A count that moved late (a flush after step 1 of a
write before it) only makes verify read the table again. Writes to the source after the
freeze are check_frozen's to find, as in mode Snapshot.
"""

from __future__ import annotations

import dataclasses

from activities.postgres.connection import Connection
from activities.postgres.fencing import RESET
from ferry.api.saga import AheadComparison, TableAhead

TABLES_AHEAD = 100
"""At most this many tables (the largest) are recorded: the record is part of the workflow's history."""

COLUMNS = """
select md5(string_agg(row(a.attnum, a.attname, a.atttypid, a.atttypmod, a.attisdropped, a.attnotnull, a.atthasmissing,
        a.attmissingval::text, a.attidentity, a.attgenerated, a.attcollation, pg_get_expr(d.adbin, d.adrelid))::text,
    ';' order by a.attnum))
from pg_attribute a left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
where a.attrelid = c.oid and a.attnum > 0
"""
"""A digest of a table's columns as the catalog holds them, the value of a fast default (attmissingval) included."""

MARKS = f"""
select n.nspname || '.' || c.relname, s.n_tup_ins + s.n_tup_upd + s.n_tup_del, c.relfilenode::bigint,
       pg_relation_size(c.oid), ({COLUMNS})
from pg_stat_user_tables s join pg_class c on c.oid = s.relid join pg_namespace n on n.oid = c.relnamespace
where c.relkind = 'r' and c.relpersistence = 'p'
"""
RESETS = f"""
select (select {RESET} from pg_stat_database where datname = current_database()), (select {RESET} from pg_stat_archiver)
"""


@dataclasses.dataclass(frozen=True)
class Marks:
    """Where each table's writes and storage stand on one side, as far as its statistics know."""

    tables: dict[str, tuple[int, int]]
    """(rows inserted, updated and deleted so far; relfilenode) by `schema.table`."""
    sizes: dict[str, int]
    """Bytes of each table's main fork, to record the largest first."""
    stats_reset: str
    columns: dict[str, str] = dataclasses.field(default_factory=dict)
    """A digest of each table's columns as its catalog holds them (`COLUMNS`)."""


def marks(conn: Connection) -> Marks:
    conn.execute("select pg_stat_clear_snapshot()")
    rows = conn.execute(MARKS).fetchall()
    reset = conn.execute(RESETS).fetchone()
    assert reset is not None
    return Marks(
        tables={str(name): (int(writes), int(file)) for name, writes, file, _, _ in rows},
        sizes={str(name): int(size) for name, _, _, size, _ in rows},
        stats_reset=f"database {reset[0] or 'never'}, server {reset[1] or 'never'}",
        columns={str(name): str(columns) for name, _, _, _, columns in rows},
    )


def largest(source: Marks, limit: int = TABLES_AHEAD) -> set[str]:
    """The tables worth comparing ahead: the largest `limit` of the source."""
    return set(sorted(source.sizes, key=lambda table: (-source.sizes[table], table))[:limit])


def compare(
    source: Marks,
    target: Marks,
    source_tables: dict[str, tuple[int, str]],
    target_tables: dict[str, tuple[int, str]],
) -> AheadComparison:
    """The record of the tables found equal (by rows and checksum, see checksums) with both sides' marks."""
    recorded = [
        TableAhead(
            table=table,
            rows=source_tables[table][0],
            checksum=source_tables[table][1],
            source_writes=source.tables[table][0],
            source_file=source.tables[table][1],
            target_writes=target.tables[table][0],
            target_file=target.tables[table][1],
            source_columns=source.columns.get(table),
            target_columns=target.columns.get(table),
        )
        for table in sorted(source_tables)
        if table in source.tables and table in target.tables and source_tables[table] == target_tables.get(table)
    ]
    return AheadComparison(
        tables=recorded, source_stats_reset=source.stats_reset, target_stats_reset=target.stats_reset
    )


def vouched(ahead: AheadComparison, source: Marks, target: Marks) -> dict[str, TableAhead]:
    """The recorded tables that neither side has written, nor changed the columns of, since (none, once either side's
    statistics were reset; none recorded without the columns' digests)."""
    if (source.stats_reset, target.stats_reset) != (ahead.source_stats_reset, ahead.target_stats_reset):
        return {}
    return {
        table.table: table
        for table in ahead.tables
        if source.tables.get(table.table) == (table.source_writes, table.source_file)
        and target.tables.get(table.table) == (table.target_writes, table.target_file)
        and table.source_columns is not None
        and table.target_columns is not None
        and source.columns.get(table.table) == table.source_columns
        and target.columns.get(table.table) == table.target_columns
    }
