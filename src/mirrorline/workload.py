"""A generated workload on a real PostgreSQL source: the tables and the random inserts, updates (some changing the
key, some leaving a large TOASTed value unchanged), deletes, delete-then-reinsert, truncates and large transactions
that the end-to-end tests, the crash tests, the demo and the benchmarks run. :attr:`Workload.counts` counts each
kind of event that reached the source (committed, or the rollbacks themselves), so a test can assert that what it
claims to replicate happened: :data:`EVENTS`; :meth:`Workload.every_kind` makes one of each for certain.

Tables (all in schema ``public``):

- ``accounts``: primary key ``id``; ``note`` sometimes holds a few kB of incompressible text (stored out of line,
  TOAST), so updates of other columns leave it unsent ("unchanged").
- ``events``: no primary key, REPLICA IDENTITY FULL: a bag of rows, every column its key. It holds identical rows
  (an insert copies a row) and rows differing only in ``label`` (an update of one copy); deletes and updates take
  every copy of ``(a, b)`` or one of them.
- ``ledger``: primary key ``(day, seq)``.
"""

from __future__ import annotations

import random
import string
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

DDL = [
    "CREATE TABLE IF NOT EXISTS public.accounts (id bigint PRIMARY KEY, owner text NOT NULL, "
    "balance numeric(12,2), active boolean, opened date, note text)",
    "CREATE TABLE IF NOT EXISTS public.events (a integer NOT NULL, b integer NOT NULL, label text)",
    "ALTER TABLE public.events REPLICA IDENTITY FULL",
    "CREATE TABLE IF NOT EXISTS public.ledger (day date NOT NULL, seq integer NOT NULL, amount bigint, "
    "memo varchar(40), PRIMARY KEY (day, seq))",
]
TABLES = ["public.accounts", "public.events", "public.ledger"]

# How a test compares source and target rows: per table, the columns in a stable order.
COLUMNS = {
    "public.accounts": ["id", "owner", "balance", "active", "opened", "note"],
    "public.events": ["a", "b", "label"],
    "public.ledger": ["day", "seq", "amount", "memo"],
}


EVENTS = (
    "truncate",  # TRUNCATE public.events
    "key_change",  # UPDATE ... SET id = ... of an account
    "key_change_unchanged_toast",  # ... whose TOASTed note is not sent
    "delete_reinsert",  # DELETE then INSERT of the same key in one transaction
    "rollback",  # a transaction rolled back
    "savepoint_rollback",  # an operation undone by ROLLBACK TO SAVEPOINT in a transaction that commits
    "streamed",  # a large transaction (streamed beyond logical_decoding_work_mem) that commits
    "streamed_abort",  # ... that rolls back
)


def _word(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def big_text(rng: random.Random, n: int = 4000) -> str:
    """Incompressible text, so PostgreSQL stores it out of line (TOAST)."""
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


@dataclass
class Workload:
    """Random operations against the source, remembering which keys exist so every operation is valid."""

    dsn: str
    seed: int = 1
    big_notes: bool = True
    rng: random.Random = field(init=False)
    accounts: set[int] = field(default_factory=set)
    events: dict[tuple[int, int], int] = field(default_factory=dict)  # (a, b) -> copies
    ledger: set[tuple[int, int]] = field(default_factory=set)
    next_id: int = 1
    statements: int = 0
    toasted: set[int] = field(default_factory=set)  # accounts whose note is stored out of line
    counts: Counter[str] = field(default_factory=Counter)  # EVENTS that reached the source
    _pending: Counter[str] = field(default_factory=Counter)  # ... in the open transaction

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        try:
            yield conn
        finally:
            conn.close()

    def create(self) -> None:
        with self._conn() as conn, conn.cursor() as cur:
            for stmt in DDL:
                cur.execute(stmt)
            conn.commit()

    def _op(self, cur: Any) -> None:
        r = self.rng.random()
        table = self.rng.choice(("accounts", "accounts", "events", "ledger"))
        self.statements += 1
        if table == "accounts":
            self._account_op(cur, r)
        elif table == "events":
            self._event_op(cur, r)
        else:
            self._ledger_op(cur, r)

    def _account_op(self, cur: Any, r: float) -> None:
        rng = self.rng
        if r < 0.4 or not self.accounts:
            i = self.next_id
            self.next_id += 1
            note = _word(rng) if rng.random() < 0.7 else None
            if self.big_notes and rng.random() < 0.2:
                note = big_text(rng)
                self.toasted.add(i)
            cur.execute(
                "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    i,
                    _word(rng),
                    round(rng.uniform(-1000, 1000), 2),
                    rng.random() < 0.5,
                    f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                    note,
                ),
            )
            self.accounts.add(i)
        elif r < 0.75:
            i = rng.choice(sorted(self.accounts))
            if rng.random() < 0.5:  # leaves note (maybe TOASTed) unchanged
                cur.execute(
                    "UPDATE public.accounts SET balance = balance + %s, active = NOT active WHERE id = %s",
                    (round(rng.uniform(-50, 50), 2), i),
                )
            else:
                cur.execute(
                    "UPDATE public.accounts SET owner = %s, note = %s WHERE id = %s",
                    (_word(rng), _word(rng, 12) if rng.random() < 0.8 else None, i),
                )
                self.toasted.discard(i)
        elif r < 0.82:  # the key changes: delete of the old key + insert of the new one downstream
            self.key_change(cur, rng.choice(sorted(self.accounts)))
        elif r < 0.9:  # delete then insert the same key in one transaction
            self.delete_reinsert(cur, rng.choice(sorted(self.accounts)))
        else:
            i = rng.choice(sorted(self.accounts))
            cur.execute("DELETE FROM public.accounts WHERE id = %s", (i,))
            self.accounts.discard(i)
            self.toasted.discard(i)

    def key_change(self, cur: Any, i: int) -> None:
        j = self.next_id
        self.next_id += 1
        cur.execute("UPDATE public.accounts SET id = %s WHERE id = %s", (j, i))
        self.accounts.discard(i)
        self.accounts.add(j)
        self._pending["key_change"] += 1
        if i in self.toasted:  # the note stays out of line and unsent: the new row's image lacks it
            self.toasted.discard(i)
            self.toasted.add(j)
            self._pending["key_change_unchanged_toast"] += 1

    def delete_reinsert(self, cur: Any, i: int) -> None:
        cur.execute("DELETE FROM public.accounts WHERE id = %s", (i,))
        cur.execute("INSERT INTO public.accounts VALUES (%s, %s, 0, true, '2024-01-01', 'again')", (i, _word(self.rng)))
        self.toasted.discard(i)
        self._pending["delete_reinsert"] += 1

    def _event_op(self, cur: Any, r: float) -> None:
        rng = self.rng
        one = "ctid = (SELECT ctid FROM public.events WHERE a = %s AND b = %s LIMIT 1)"
        if r < 0.5 or not self.events:
            if self.events and rng.random() < 0.3:  # a copy of a row that is there: two identical rows
                k = rng.choice(sorted(self.events))
                cur.execute("INSERT INTO public.events SELECT * FROM public.events WHERE a = %s AND b = %s LIMIT 1", k)
                self.events[k] += 1
                return
            k = (rng.randint(1, 10**6), rng.randint(1, 100))
            if k in self.events:
                return
            cur.execute("INSERT INTO public.events VALUES (%s, %s, %s)", (*k, _word(rng)))
            self.events[k] = 1
        elif r < 0.8:
            k = rng.choice(sorted(self.events))
            where = one if rng.random() < 0.5 else "a = %s AND b = %s"
            cur.execute(f"UPDATE public.events SET label = %s WHERE {where}", (_word(rng), *k))
        elif r < 0.99:
            k = rng.choice(sorted(self.events))
            if rng.random() < 0.5 and self.events[k] > 1:
                cur.execute(f"DELETE FROM public.events WHERE {one}", k)
                self.events[k] -= 1
            else:
                cur.execute("DELETE FROM public.events WHERE a = %s AND b = %s", k)
                del self.events[k]
        else:
            self.truncate(cur)

    def truncate(self, cur: Any) -> None:
        cur.execute("TRUNCATE public.events")
        self.events.clear()
        self._pending["truncate"] += 1

    def _ledger_op(self, cur: Any, r: float) -> None:
        rng = self.rng
        if r < 0.6 or not self.ledger:
            k = (rng.randint(1, 28), rng.randint(1, 10**6))
            if k in self.ledger:
                return
            cur.execute(
                "INSERT INTO public.ledger VALUES (%s, %s, %s, %s)",
                (f"2024-02-{k[0]:02d}", k[1], rng.randint(-(10**12), 10**12), _word(rng, 20)),
            )
            self.ledger.add(k)
        elif r < 0.85:
            k = rng.choice(sorted(self.ledger))
            cur.execute(
                "UPDATE public.ledger SET amount = amount + 1, memo = %s WHERE day = %s AND seq = %s",
                (_word(rng), f"2024-02-{k[0]:02d}", k[1]),
            )
        else:
            k = rng.choice(sorted(self.ledger))
            cur.execute("DELETE FROM public.ledger WHERE day = %s AND seq = %s", (f"2024-02-{k[0]:02d}", k[1]))
            self.ledger.discard(k)

    def _state(self) -> tuple[Any, ...]:
        return set(self.accounts), dict(self.events), set(self.ledger), self.next_id, set(self.toasted)

    def _restore(self, saved: tuple[Any, ...]) -> None:
        self.accounts, self.events, self.ledger, self.next_id, self.toasted = saved

    def _end(self, conn: Any, commit: bool, saved: tuple[Any, ...]) -> None:
        if commit:
            conn.commit()
            self.counts.update(self._pending)
        else:
            conn.rollback()
            self._restore(saved)
            self.counts["rollback"] += 1
        self._pending.clear()

    def _undone_op(self, cur: Any) -> None:
        """One operation undone by ROLLBACK TO SAVEPOINT: the source, and what this workload knows, as before."""
        saved, pending = self._state(), Counter(self._pending)
        cur.execute("SAVEPOINT mirrorline_workload")
        self._op(cur)
        cur.execute("ROLLBACK TO SAVEPOINT mirrorline_workload")
        self._restore(saved)
        self._pending = pending
        self._pending["savepoint_rollback"] += 1

    def run(
        self,
        transactions: int,
        ops_per_transaction: tuple[int, int] = (1, 8),
        rollback_share: float = 0.05,
        savepoint_share: float = 0.05,
    ) -> None:
        """Run ``transactions`` random transactions; some roll back, some undo one operation to a savepoint."""
        with self._conn() as conn:
            for _ in range(transactions):
                saved = self._state()
                with conn.cursor() as cur:
                    for _ in range(self.rng.randint(*ops_per_transaction)):
                        if self.rng.random() < savepoint_share:
                            self._undone_op(cur)
                        self._op(cur)
                self._end(conn, self.rng.random() >= rollback_share, saved)

    def every_kind(self) -> None:
        """One transaction of each kind in :data:`EVENTS` but the streamed ones (:meth:`large_transaction`), for
        certain: a TRUNCATE, a key change of an account with a TOASTed note, a delete then re-insert, a savepoint
        rollback, a rollback."""
        with self._conn() as conn:
            for step in ("toasted", "key_change", "delete_reinsert", "truncate", "savepoint", "rollback"):
                saved = self._state()
                with conn.cursor() as cur:
                    if step == "toasted":
                        i = self.next_id
                        self.next_id += 1
                        cur.execute(
                            "INSERT INTO public.accounts VALUES (%s, 'toast', 1, true, '2024-01-01', %s)",
                            (i, big_text(self.rng)),
                        )
                        self.accounts.add(i)
                        self.toasted.add(i)
                    elif step == "key_change":
                        self.key_change(cur, max(self.toasted))
                    elif step == "delete_reinsert":
                        self.delete_reinsert(cur, min(self.accounts))
                    elif step == "truncate":
                        cur.execute("INSERT INTO public.events VALUES (1, 1, 'x'), (1, 1, 'x')")
                        self.truncate(cur)
                    else:
                        self._undone_op(cur)
                        self._op(cur)
                self._end(conn, step != "rollback", saved)

    def large_transaction(self, rows: int, abort: bool = False) -> None:
        """One transaction inserting ``rows`` accounts and updating them all: streamed by PostgreSQL when it
        exceeds logical_decoding_work_mem; ``abort``: rolled back at the end (a streamed abort)."""
        first = self.next_id
        self.next_id += rows
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO public.accounts SELECT g, 'bulk' || g, g %% 1000, g %% 2 = 0, '2024-03-01', NULL "
                "FROM generate_series(%s, %s) g",
                (first, first + rows - 1),
            )
            cur.execute(
                "UPDATE public.accounts SET balance = balance + 1 WHERE id BETWEEN %s AND %s", (first, first + rows - 1)
            )
            if abort:
                conn.rollback()
                # an abort record is not flushed by itself: a commit after it makes the WAL to it durable and sent
                cur.execute("SELECT pg_logical_emit_message(true, 'mirrorline-workload', 'after an abort')")
                conn.commit()
                self.counts["streamed_abort"] += 1
                return
            conn.commit()
        self.accounts.update(range(first, first + rows))
        self.counts["streamed"] += 1

    def mark(self) -> int:
        """Commit one small transaction and return an LSN below its commit record: once the log holds a change at
        or past it, the log holds everything committed before this call."""
        with self._conn() as conn, conn.cursor() as cur:
            k = (0, self.rng.randint(1, 10**9))
            cur.execute("INSERT INTO public.events VALUES (%s, %s, 'mark')", k)
            cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            lsn = int(cur.fetchone()[0])
            conn.commit()
        self.events[k] = self.events.get(k, 0) + 1
        return lsn


def source_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    """A table's rows from PostgreSQL, every value as PostgreSQL's text (None for NULL), sorted."""
    import psycopg2

    cols = COLUMNS[table]
    sel = ", ".join(f'"{c}"::text' for c in cols)
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {sel} FROM {table}")
            return sorted(cur.fetchall(), key=repr)
    finally:
        conn.close()
