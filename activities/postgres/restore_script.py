"""Restoring through psql, so that every table's rows arrive frozen (COPY ... FREEZE).

Why. pg_restore loads rows with a plain COPY. The first read of a restored row then
records on its page that the restore's transaction committed (the row's hint bits), so
verify's first read of the target writes every page again, and with data checksums (on
by default since PostgreSQL 18) each page changed so after a checkpoint goes to the WAL
whole. COPY with FREEZE, allowed on a table created or emptied in the same transaction,
loads rows already marked committed and frozen and their pages all-visible: on 1 GB,
the target's first read went from 5.9-6.4 s to 2.9-3.1 s, and the restore took as long
(docs/performance.md). Frozen rows also spare the target's autovacuum a later pass over
every page to freeze them.

pg_restore cannot be asked for FREEZE. So, where this module says it can be used,
`restoring.Restore` has pg_restore write its SQL script (--file=-), `Copies` adds FREEZE
to the COPY of each table named beforehand, and psql runs the script on the target.

What keeps it safe:

- **All or nothing, as before.** pg_restore --single-transaction writes BEGIN first
  and COMMIT last, and writes COMMIT only once it has read the whole archive, which
  Restore holds back the end of until the stream is known whole. psql runs without
  --single-transaction and is handed the end of its input only once pg_restore exited
  cleanly and `Copies` saw the script end with COMMIT; any other way, psql is killed,
  and the server rolls its transaction back.
- **No meta-commands from the dump.** Names and other text in a dump could hold a line
  psql would read as a meta-command. pg_restore's scripts since 18.0 (and 17.6, 16.10,
  15.14, 14.19 and 13.22) begin with `\\restrict` and a random key, after which psql
  refuses every meta-command; `Copies` refuses a script that does not begin so.
- **The rows are not touched.** A COPY's rows run to a line `\\.` (a row's own
  backslashes are doubled, so no row reads so); `Copies` only ever changes a line
  outside them, the COPY statement, which pg_restore writes on a line of its own.
- **FREEZE only where it cannot fail.** FREEZE refuses a partitioned table (which
  pg_dump loads through its root for some partitionings). Only a COPY into a table
  `freezable` named on the source (an ordinary table, not an extension's), spelled as
  quote_ident spells it (as pg_dump does), gets FREEZE; any other COPY loads as before.
- **Only where the script runs as pg_restore would.** A script carries the settings of
  its pg_restore's version (`SET transaction_timeout`, new in 17), which pg_restore
  leaves out only when it talks to an older server itself: this way is used only when
  the target's server is at least the tools' major version (`usable`); otherwise
  pg_restore restores directly, as it always did.

Memory: `Copies` keeps at most one line outside the rows (a line longer than
LINE_LIMIT, which no COPY statement of pg_dump's is, is passed on as it comes) and the
last three bytes of the rows.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from activities.postgres import replication
from activities.postgres.connection import Connection
from activities.postgres.tools import find_bindir, version

RESTRICTED_SINCE = {13: 22, 14: 19, 15: 14, 16: 10, 17: 6}
"""The first minor release of each older major whose pg_restore begins its scripts with \\restrict; 18 always did."""
LINE_LIMIT = 1 << 20
"""The longest line outside the rows that `Copies` holds whole: pg_dump's longest COPY statement (1,600 columns of
quoted 63-byte names) is about 200 KB."""
END_OF_ROWS = b"\n\\.\n"
COPY_START, COPY_END = b"COPY ", b" FROM stdin;\n"
STANDARD_STRINGS = {
    b"SET standard_conforming_strings = off;": True,
    b"SET standard_conforming_strings = on;": False,
}
"""How pg_restore's script says whether a backslash escapes in quotes, and what that makes of it."""
_IDENTIFIER = rb'(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_]*)'
_COPY_INTO = re.compile(rb"COPY (" + _IDENTIFIER + rb"\." + _IDENTIFIER + rb") (?:\(.*\) )?FROM stdin;\n", re.DOTALL)

FREEZABLE = f"""
select convert_to(quote_ident(n.nspname) || '.' || quote_ident(c.relname), pg_catalog.getdatabaseencoding())
{replication.USER_TABLES} and c.relkind = 'r'
"""
"""The source's ordinary tables that belong to no extension, named as the dump names them, in the dump's encoding."""


class ScriptRefused(RuntimeError):
    """pg_restore's script is not one psql may run as `Copies` expects: nothing of it was committed."""


def freezable(conn: Connection) -> frozenset[bytes]:
    """The tables of the source on `conn` whose COPY may load its rows frozen (see FREEZABLE)."""
    return frozenset(bytes(row[0]) for row in conn.execute(FREEZABLE))


def usable(configured: Path | None, server_version: int) -> bool:
    """Whether the worker's tools (see tools.find_bindir) can restore through psql into a server of `server_version`.

    That needs psql beside pg_restore, both versions writing and obeying \\restrict, and a
    server (`server_version` as libpq gives it, 180006 for 18.6) at least the tools' major
    version (see the module's docstring).
    """
    tools = _restricting_major(find_bindir(configured))
    return tools is not None and server_version // 10000 >= tools


@functools.cache
def _restricting_major(bindir: Path) -> int | None:
    """The major version of `bindir`'s pg_restore and psql when both know \\restrict, else None."""
    if not os.access(bindir / "psql", os.X_OK):
        return None
    try:
        found = {version(bindir, tool) for tool in ("pg_restore", "psql")}
    except RuntimeError:
        return None
    if len(found) != 1:
        return None
    (said,) = found
    numbers = [int(part) for part in said.split(".")]
    tools_major, minor = numbers[0], numbers[1] if len(numbers) > 1 else 0
    if tools_major < 18 and minor < RESTRICTED_SINCE.get(tools_major, 1 << 30):
        return None
    return tools_major


class Copies:
    """Passes pg_restore's script on to psql, with FREEZE added to the COPY of each table in `tables`.

    `feed` takes the script piece by piece, as pg_restore writes it, and returns what to
    hand psql; `complete` says whether what went through is a whole script, its last
    statement COMMIT. A COPY statement is recognized where psql would run one: a line
    that begins between two statements (`Lexer`: not inside a quote, a comment or a
    statement) and ends its statement; its rows run to the line `\\.`. A pure
    transformation, no I/O: the unit tests give it any pieces.
    """

    def __init__(self, tables: frozenset[bytes], truncate: bool = False) -> None:
        self._tables = tables
        self._truncate = truncate
        """Empty each table in the script's transaction before its COPY with FREEZE: FREEZE needs a table created or
        emptied in its transaction, and a script of rows alone (a parallel stream's, see streams) creates none."""
        self._lexer = Lexer()
        self._line = bytearray()
        """The current line outside the rows, up to LINE_LIMIT, until its newline comes."""
        self._long: tuple[bool, bytes, bytes] | None = None
        """While a line longer than LINE_LIMIT passes: whether it began between statements, its first five bytes, and
        what the lexer has yet to read of it."""
        self._copying = False
        """Inside a COPY's rows."""
        self._recent = b""
        """The last bytes of the rows passed on (at most three): the end of the rows may span two pieces."""
        self._restricted = False
        self._last = b""
        """The last line of SQL outside the rows, stripped (comments and meta-commands aside)."""
        self.frozen = 0
        """How many COPYs got FREEZE."""

    @property
    def complete(self) -> bool:
        """Whether the script went through whole: restricted, outside any rows, its last statement COMMIT."""
        return (
            self._restricted and not self._copying and not self._line and self._long is None
            and self._lexer.between_statements and self._last == b"COMMIT;"
        )  # fmt: skip

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """What to hand psql for this piece of the script (some may be held back until the line ends).

        Raises:
            ScriptRefused: the script does not begin with \\restrict.
        """
        out: list[bytes | memoryview] = []
        view, at = memoryview(data), 0
        while at < len(data):
            at = self._rows(data, view, at, out) if self._copying else self._statement(data, view, at, out)
        return out

    def _rows(self, data: bytes, view: memoryview, at: int, out: list[bytes | memoryview]) -> int:
        """Passes rows on up to and including their end, `\\.` on a line of its own; returns where it stopped."""
        across = (self._recent + data[at : at + 3]).find(END_OF_ROWS)
        if across >= 0:
            end = at + across + len(END_OF_ROWS) - len(self._recent)
        else:
            found = data.find(END_OF_ROWS, at)
            end = -1 if found < 0 else found + len(END_OF_ROWS)
        if end < 0:
            out.append(view[at:])
            self._recent = (self._recent + data[max(at, len(data) - 3) :])[-3:]
            return len(data)
        out.append(view[at:end])
        self._copying, self._recent = False, b""
        return end

    def _statement(self, data: bytes, view: memoryview, at: int, out: list[bytes | memoryview]) -> int:
        """Takes script text outside the rows up to the end of a line; returns where it stopped."""
        newline = data.find(b"\n", at)
        stop = len(data) if newline < 0 else newline + 1
        if self._long is not None:
            out.append(view[at:stop])
            began, head, unread = self._long
            unread += data[at:stop]
            if newline < 0:
                self._long = (began, head, unread[self._lexer.scan(unread, final=False) :])
                return stop
            self._lexer.scan(unread, final=True)
            self._long = None
            self._ended(began, head, unread[-len(COPY_END) :], None)
            return stop
        self._line += view[at:stop]
        if newline < 0:
            if len(self._line) > LINE_LIMIT:  # no COPY statement of pg_dump's: passed on as it comes
                began, text = self._lexer.between_statements, bytes(self._line)
                self._long = (began, text[:5], text[self._lexer.scan(text, final=False) :])
                out.append(text)
                self._line.clear()
            return stop
        line = bytes(self._line)
        self._line.clear()
        began = self._lexer.between_statements
        self._lexer.scan(line, final=True)
        out.append(self._ended(began, line[:5], line[-len(COPY_END) :], line) or line)
        return stop

    def _ended(self, began: bool, head: bytes, tail: bytes, line: bytes | None) -> bytes | None:
        """A whole line outside the rows (`line` when held whole), read by the lexer: checks it, notes it, and returns
        the COPY statement it is with FREEZE added, or None to pass it on as it is."""
        stripped = line.strip() if line is not None else None
        if not self._restricted:
            if stripped is not None and stripped.startswith(b"\\restrict "):
                self._restricted = True
                return None
            if stripped == b"" or (stripped is not None and stripped.startswith(b"--")):
                return None
            raise ScriptRefused(
                "pg_restore's script does not begin with \\restrict, so psql could run meta-commands a dump carries: "
                "give the worker PostgreSQL client tools of 18.0 (or 17.6, 16.10, 15.14) or later"
            )
        if stripped is None:
            self._last = b"(a long line)"
        elif stripped and not stripped.startswith((b"--", b"\\")):
            self._last = stripped
        if began and stripped in STANDARD_STRINGS:
            self._lexer.backslashes_escape = STANDARD_STRINGS[stripped]
        if not (began and head == COPY_START and tail == COPY_END and self._lexer.between_statements):
            return None
        self._copying, self._recent = True, b"\n"  # psql reads the rows from the next line on
        found = _COPY_INTO.fullmatch(line) if line is not None else None
        if line is None or found is None or found.group(1) not in self._tables:
            return None
        self.frozen += 1
        frozen = line[: -len(b";\n")] + b" WITH (FREEZE);\n"
        return b"TRUNCATE ONLY " + found.group(1) + b";\n" + frozen if self._truncate else frozen


class Lexer:
    """Where psql stands in SQL text: in a quote, a comment or a meta-command, or between statements.

    It follows what psql's own lexer tells apart for splitting statements: single quotes
    (with '' inside, and backslash escapes in E'...'), double-quoted identifiers,
    dollar quotes ($$ or $tag$), -- and nested /* */ comments, parentheses (psql ends
    a statement only at a semicolon outside them), and a backslash outside all of
    these, which begins a meta-command running to the end of its line. A dump of a server
    with standard_conforming_strings off says so (`SET standard_conforming_strings = off;`),
    and then a backslash escapes in every quote (`backslashes_escape`).
    """

    LOOKAHEAD = 66
    """The most bytes one token needs seen whole: a dollar quote's delimiter ($, a 63-byte tag, $) and then some."""

    def __init__(self) -> None:
        self._state = _SQL
        self._tag = b""
        """The delimiter of the dollar quote it is in."""
        self._depth = 0
        """How deep in nested block comments."""
        self._parentheses = 0
        self._begun = False
        """Something of a statement came since the last semicolon outside parentheses."""
        self._before = b"  "
        """The last two bytes read: an E before a quote makes it an escape string."""
        self.backslashes_escape = False
        """Whether a backslash escapes in every quote, as with standard_conforming_strings off."""

    @property
    def between_statements(self) -> bool:
        return self._state == _SQL and not self._begun and self._parentheses == 0

    def scan(self, text: bytes, final: bool) -> int:
        """Reads `text` and returns how much of it was read: all of it when `final`; otherwise it stops short of the
        last LOOKAHEAD bytes, and the caller gives the rest again, with what follows it."""
        limit = len(text) if final else len(text) - self.LOOKAHEAD
        at = 0
        while at < limit:
            at = self._step(text, at, limit)
        at = min(at, len(text))
        if at:
            self._before = (self._before + text[max(0, at - 2) : at])[-2:]
        return at

    def _preceding(self, text: bytes, at: int) -> bytes:
        """The two bytes before `at`, counting those read before `text`."""
        return text[at - 2 : at] if at >= 2 else (self._before + text[:at])[-2:]

    def _step(self, text: bytes, at: int, limit: int) -> int:
        """Reads from `at` on, through the next token that starts before `limit`; returns where it stopped."""
        if self._state == _SQL:
            found = _NEXT_IN_SQL.search(text, at)
            start = len(text) if found is None else found.start()
            if start >= limit:  # nothing starts before the limit: the text up to it holds no token
                self._begun = self._begun or bool(text[at:limit].strip())
                return limit
            self._begun = self._begun or bool(text[at:start].strip())
            assert found is not None
            return self._token(text, found.group(), start)
        end = _QUOTE_ENDS.get(self._state)
        if end is not None:
            found = end.search(text, at)
            if found is None or found.start() >= limit:
                return limit
            if found.group() in (b"''", b'""') or found.group().startswith(b"\\"):
                return found.end()  # a quote doubled, or an escaped byte: still inside
            self._state = _SQL
            return found.end()
        if self._state == _DOLLAR:
            found_at = text.find(self._tag, at)
            if found_at < 0 or found_at >= limit:
                return limit
            self._state = _SQL
            return found_at + len(self._tag)
        if self._state == _COMMENT:
            found = _COMMENT_EDGE.search(text, at)
            if found is None or found.start() >= limit:
                return limit
            self._depth += 1 if found.group() == b"/*" else -1
            if self._depth == 0:
                self._state = _SQL
            return found.end()
        found_at = text.find(b"\n", at)  # the rest of a line: a -- comment, or a meta-command
        if found_at < 0 or found_at >= limit:
            return limit
        self._state = _SQL
        return found_at + 1

    def _token(self, text: bytes, token: bytes, start: int) -> int:
        """Acts on a token found outside quotes and comments; returns where reading goes on."""
        after = start + len(token)
        preceding = self._preceding(text, start)
        if token == b"'":
            escape = preceding[1:] in (b"E", b"e") and not _IDENTIFIER_BYTE.fullmatch(preceding[:1])
            escape = escape or self.backslashes_escape
            self._state, self._begun = (_ESCAPE_QUOTE if escape else _QUOTE), True
        elif token == b'"':
            self._state, self._begun = _NAME_QUOTE, True
        elif token == b"$":
            self._begun = True
            if not _IDENTIFIER_BYTE.fullmatch(preceding[1:]):
                found = _DOLLAR_TAG.match(text, start)
                if found is not None:  # otherwise a parameter ($1) or a lone dollar
                    self._state, self._tag = _DOLLAR, found.group()
                    return found.end()
        elif token == b";":
            if self._parentheses == 0:
                self._begun = False
        elif token == b"(":
            self._parentheses, self._begun = self._parentheses + 1, True
        elif token == b")":
            self._parentheses = max(0, self._parentheses - 1)
        elif token == b"/*":
            self._state, self._depth = _COMMENT, 1
        elif token in (b"--", b"\\"):
            self._state = _REST_OF_LINE
        return after


_SQL, _QUOTE, _ESCAPE_QUOTE, _NAME_QUOTE, _DOLLAR, _COMMENT, _REST_OF_LINE = range(7)
_NEXT_IN_SQL = re.compile(rb"""['"$;()\\]|--|/\*""")
_QUOTE_END = re.compile(rb"''|'")
_ESCAPE_QUOTE_END = re.compile(rb"\\[\s\S]|''|'")
_NAME_QUOTE_END = re.compile(rb'""|"')
_QUOTE_ENDS = {_QUOTE: _QUOTE_END, _ESCAPE_QUOTE: _ESCAPE_QUOTE_END, _NAME_QUOTE: _NAME_QUOTE_END}
_COMMENT_EDGE = re.compile(rb"/\*|\*/")
_DOLLAR_TAG = re.compile(rb"\$(?:[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*)?\$")
_IDENTIFIER_BYTE = re.compile(rb"[A-Za-z0-9_$\x80-\xff]")
