"""The cause of a failure as the terminal shows it: the last meaningful lines of the last run in a component's log."""

from __future__ import annotations

from pathlib import Path

from devstack.stack.logtail import cause_lines, meaningful


def test_only_the_last_run_of_a_log_counts() -> None:
    log = (
        "\n--- 2026-11-21T10:00:00 /usr/lib/postgresql/15/bin/postgres -D /old\n"
        "FATAL:  an old failure, fixed since\n"
        "\n--- 2026-11-22T10:00:00 /usr/lib/postgresql/15/bin/postgres -D /new\n"
        "LOG:  starting PostgreSQL 15.14\n"
        'FATAL:  data directory "/new" has invalid permissions\n'
        "DETAIL:  Permissions should be u=rwx (0700) or u=rwx,g=rx (0750).\n"
    )

    assert meaningful(log) == [
        "LOG: starting PostgreSQL 15.14",
        'FATAL: data directory "/new" has invalid permissions',
        "DETAIL: Permissions should be u=rwx (0700) or u=rwx,g=rx (0750).",
    ]


def test_blank_lines_are_skipped_and_at_most_three_lines_are_kept() -> None:
    log = "one\n\ntwo\n   \nthree\nfour\n\n"

    assert meaningful(log) == ["two", "three", "four"]


def test_a_structured_line_shows_its_level_message_and_error_without_its_stack_trace() -> None:
    log = (
        '{"level":"fatal","ts":"2026-11-22T22:22:42Z","caller":"etcdmain/etcd.go:227",'
        '"msg":"failed to list data directory","dir":"/s/etcd","error":"readdirent /s/etcd: not a directory",'
        '"stacktrace":"go.etcd.io/etcd/server/v3/etcdmain.identifyDataDirOrDie\\n\\tgo.etcd.io/..."}\n'
    )

    assert meaningful(log) == ["fatal: failed to list data directory: readdirent /s/etcd: not a directory"]


def test_a_go_panic_shows_the_panic_not_the_goroutines() -> None:
    log = (
        "I1122 starting\n"
        "panic: listen tcp 127.0.0.1:8080: bind: address already in use\n"
        "\n"
        "goroutine 1 [running]:\n"
        "main.main()\n"
        "\t/src/main.go:12 +0x1d\n"
        "exit status 2\n"
    )

    assert meaningful(log) == ["I1122 starting", "panic: listen tcp 127.0.0.1:8080: bind: address already in use"]


def test_a_python_traceback_shows_its_exception() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/app/main.py", line 3, in <module>\n'
        "    main()\n"
        "OSError: [Errno 98] Address already in use\n"
    )

    assert meaningful(log) == ["OSError: [Errno 98] Address already in use"]


def test_each_line_is_trimmed_to_a_terminal_line() -> None:
    assert meaningful("x" * 500, width=80) == ["x" * 79 + "…"]


def test_a_log_that_does_not_exist_has_no_cause(tmp_path: Path) -> None:
    assert cause_lines(tmp_path / "missing.log") == []
