"""What every reader and writer of a cache database agrees on without SQLAlchemy: the schema version, the kernel
columns a lookup reads, and the graph guard table kept beside the versioned schema.

The models (:mod:`kernel_cache.models`) declare the tables; the driver-only readers (:mod:`kernel_cache.reader`)
read them with the constants here, and refuse a database at any other version, so a change to the kernels table
raises :data:`SCHEMA_VERSION` and adds a step to :mod:`kernel_cache.migrations`.
"""

from __future__ import annotations

from dataclasses import fields

from kernel_cache.record import KernelRecord

# The schema version this code reads and writes.
SCHEMA_VERSION = 4
# The first bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
# The kernels table's columns that make a KernelRecord, in the record's order.
KERNEL_FIELDS = [f.name for f in fields(KernelRecord)]

# A lookup's first rule: kernels with a judged plan before those without, which nothing serves (a row stored before
# plans were kept, or one a plan could not be recorded for); as SQL, an ORDER BY term of the kernels table.
PLANLESS_LAST = "COALESCE(plan, '') = ''"

# Graph guard decisions are measurements that can always be taken again, so their table lives outside the versioned
# schema: an older kernelsmith opens a database that has it as before.
GUARD_TABLE = "graph_guard_decisions"
GUARD_DDL = (f"CREATE TABLE IF NOT EXISTS {GUARD_TABLE} (key VARCHAR(64) NOT NULL PRIMARY KEY, "
             "fingerprint_id VARCHAR(32) NOT NULL, kept BOOLEAN NOT NULL, result TEXT NOT NULL, "
             "created_at FLOAT NOT NULL)")

# A region's room (``ks_inductor.judge.room.Room``): its baselines' times and its floor on one machine, measured by the
# judge. Like the guard decisions, a measurement that can always be taken again: outside the versioned schema.
ROOM_TABLE = "region_rooms"
ROOM_DDL = (f"CREATE TABLE IF NOT EXISTS {ROOM_TABLE} (key VARCHAR(128) NOT NULL PRIMARY KEY, "
            "problem_key VARCHAR(64) NOT NULL, fingerprint_id VARCHAR(32) NOT NULL, result TEXT NOT NULL, "
            "created_at FLOAT NOT NULL)")


def room_key(problem_key: str, fingerprint_id: str) -> str:
    """The room table's key: a region's room is per problem and per machine (hardware and software versions)."""
    return f"{problem_key}|{fingerprint_id}"
