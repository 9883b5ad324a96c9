"""`ferry worker` and `ferry watcher` settings: defaults, FERRY_ variables, flags over variables, bad values.

Each component's settings are one declared class (worker/settings.py, watcher/settings.py);
these tests go through the real `ferry` parser and loader, as the command does, without
starting anything: a bad value must end the command with one line and exit code 2.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.settings import MIB
from ferry import cli
from ferry.configuration.knobs import options
from tests.deploy.files import SETTINGS, settings
from watcher.settings import LeaseSettings

pytestmark = pytest.mark.unit

KUBECONFIG = Path(__file__)
"""Any existing file does: the kubeconfig is only checked to be a file until a component starts."""


load = settings
"""What `ferry <argv>` runs with, given exactly these environment variables."""


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """os.environ without the FERRY_ variables (and their fallbacks) of the test run itself."""
    for name in [name for name in os.environ if name.startswith("FERRY_")]:
        monkeypatch.delenv(name)
    for name in ("KUBECONFIG", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """`ferry <argv>` in this process: its exit code and the lines it wrote to stderr."""
    code = cli.main(argv)
    return code, capsys.readouterr().err.splitlines()


# --- defaults, variables, flags ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "watcher"])
def test_with_nothing_set_a_component_runs_with_the_declared_defaults(command: str) -> None:
    loaded = load([command])

    assert loaded == SETTINGS[command]()
    assert loaded.temporal.address == "localhost:7233"
    assert loaded.temporal.namespace == "default"
    assert loaded.task_queue == "ferry"
    assert loaded.kubeconfig is None
    assert loaded.observability.log_format == "json"


def test_the_workers_defaults_are_those_its_activities_declare() -> None:
    loaded = load(["worker"])

    assert loaded.max_concurrent_activities == 20
    assert loaded.kube_activities.poll_interval == 1.0
    assert loaded.data_activities.part_size == 16 * MIB
    assert loaded.data_activities.upload_concurrency == 4
    assert loaded.data_activities.dump_compression == 0


def test_ferry_variables_set_the_knobs_in_their_own_units() -> None:
    worker = load(
        ["worker"],
        {
            "FERRY_TEMPORAL_ADDRESS": "temporal:7233",
            "FERRY_POLL_INTERVAL": "2.5",
            "FERRY_SNAPSHOT_PART_SIZE_MIB": "32",
            "FERRY_KUBECONFIG": str(KUBECONFIG),
            "FERRY_TRACE_FILE": "/tmp/spans.jsonl",
        },
    )
    watcher = load(["watcher"], {"FERRY_NAMESPACES": "shop, billing,", "FERRY_LEASE_DURATION": "40"})

    assert worker.temporal.address == "temporal:7233"
    assert worker.kube_activities.poll_interval == 2.5
    assert worker.data_activities.part_size == 32 * MIB
    assert worker.kubeconfig == KUBECONFIG
    assert worker.observability.tracing.file == Path("/tmp/spans.jsonl")
    assert watcher.namespaces == ("shop", "billing")
    assert watcher.lease.duration == 40.0


def test_the_usual_variables_of_kubernetes_and_opentelemetry_count_when_the_ferry_ones_are_unset() -> None:
    fallback = load(["worker"], {"KUBECONFIG": str(KUBECONFIG), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"})
    ferrys = load(["worker"], {"KUBECONFIG": "/no/such/file", "FERRY_KUBECONFIG": str(KUBECONFIG)})

    assert fallback.kubeconfig == KUBECONFIG
    assert fallback.observability.tracing.otlp_endpoint == "http://otel:4318"
    assert ferrys.kubeconfig == KUBECONFIG


def test_a_flag_wins_over_its_variable() -> None:
    loaded = load(
        ["watcher", "--temporal-address=flag:7233", "--lease-duration=30", "--namespaces=a,b"],
        {"FERRY_TEMPORAL_ADDRESS": "variable:7233", "FERRY_LEASE_DURATION": "20", "FERRY_NAMESPACES": "c"},
    )

    assert loaded.temporal.address == "flag:7233"
    assert loaded.lease.duration == 30.0
    assert loaded.namespaces == ("a", "b")


def test_an_empty_variable_or_flag_means_the_default() -> None:
    unset = {"FERRY_TASK_QUEUE": "", "FERRY_TEMPORAL_UI_URL": "", "FERRY_METRICS_ADDRESS": ""}
    from_variables = load(["worker"], unset)
    from_flag = load(["worker", "--metrics-address="], {"FERRY_METRICS_ADDRESS": "0.0.0.0:9464"})

    assert from_variables.task_queue == "ferry"
    assert from_variables.kube_activities.temporal_ui_url is None
    assert from_variables.observability.metrics_address is None
    assert from_flag.observability.metrics_address is None


def test_the_identity_in_the_lease_defaults_to_this_process() -> None:
    assert load(["watcher"]).lease.identity == f"{socket.gethostname()}-{os.getpid()}"
    assert load(["watcher", "--identity=watcher-0"]).lease.identity == "watcher-0"


EARLIER_NAMES = {
    "worker": {
        "--temporal-address": "t:1", "--temporal-namespace": "ns", "--temporal-tls-ca": str(KUBECONFIG),
        "--temporal-api-key": "key", "--task-queue": "q", "--temporal-ui-url": "http://ui",
        "--kubeconfig": str(KUBECONFIG), "--metrics-address": "0.0.0.0:9", "--otlp-endpoint": "http://o",
        "--trace-file": "/tmp/t", "--health-address": "0.0.0.0:8", "--log-format": "text",
        "--graceful-shutdown": "5", "--max-concurrent-activities": "3", "--poll-interval": "0.5",
        "--postgres-bindir": "/usr/bin", "--snapshot-part-size-mib": "8", "--snapshot-upload-concurrency": "2",
        "--snapshot-compression": "6",
    },
    "watcher": {
        "--temporal-address": "t:1", "--temporal-namespace": "ns", "--temporal-api-key": "key", "--task-queue": "q",
        "--kubeconfig": str(KUBECONFIG), "--metrics-address": "0.0.0.0:9", "--otlp-endpoint": "http://o",
        "--trace-file": "/tmp/t", "--health-address": "0.0.0.0:8", "--log-format": "text", "--namespaces": "a",
        "--lease-name": "l", "--lease-namespace": "n", "--lease-duration": "60", "--lease-renew-deadline": "9",
        "--lease-retry-period": "1", "--identity": "me", "--resync-interval": "5", "--deletion-timeout": "60",
    },
}  # fmt: skip
"""Every flag of the release before settings were declared, with a value for it; FERRY_ + its name is its variable."""


@pytest.mark.parametrize(("command", "flag"), [(c, f) for c, flags in EARLIER_NAMES.items() for f in flags])
def test_the_flags_and_variables_of_earlier_releases_set_the_same_knob(command: str, flag: str) -> None:
    value = EARLIER_NAMES[command][flag]
    variable = "FERRY_" + flag.removeprefix("--").upper().replace("-", "_")

    by_flag = load([command, f"{flag}={value}"])
    by_variable = load([command], {variable: value})

    assert by_flag == by_variable != load([command])


@pytest.mark.parametrize("command", ["worker", "watcher"])
def test_help_describes_every_knob_with_its_variable_and_default(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())

    assert exited.value.code == 0
    for option in options(SETTINGS[command]):
        assert option.description, f"{option.flag} has no docstring"
        assert f"{option.flag} " in shown
        assert f"{option.description} [{', '.join(option.env)}]" in shown
    assert "[FERRY_SNAPSHOT_PART_SIZE_MIB] (in MiB; default: 16)" in shown or command == "watcher"
    assert "[FERRY_LEASE_DURATION] (default: 15.0)" in shown or command == "worker"


def test_settings_made_in_code_are_checked_as_well() -> None:
    with pytest.raises(ValidationError, match="retry-period < --lease-renew-deadline < --lease-duration"):
        LeaseSettings(duration=5, renew_deadline=10)


# --- bad values --------------------------------------------------------------------------------------


BAD_VALUES = [
    (
        ["worker"],
        {"FERRY_POLL_INTERVAL": "abc"},
        "ferry worker: --poll-interval (FERRY_POLL_INTERVAL): input should be a valid number, "
        "unable to parse string as a number (got 'abc' from FERRY_POLL_INTERVAL)",
    ),
    (
        ["worker", "--max-concurrent-activities", "2.5"],
        {},
        "ferry worker: --max-concurrent-activities (FERRY_MAX_CONCURRENT_ACTIVITIES): input should be a valid "
        "integer, unable to parse string as an integer (got '2.5' from --max-concurrent-activities)",
    ),
    (
        ["worker", "--snapshot-part-size-mib=0"],
        {},
        "ferry worker: --snapshot-part-size-mib (FERRY_SNAPSHOT_PART_SIZE_MIB): should be from 5 MiB to 5 GiB, "
        "the sizes S3 allows for a part (got '0' from --snapshot-part-size-mib)",
    ),
    (
        ["worker"],
        {"FERRY_SNAPSHOT_PART_SIZE_MIB": "lots"},
        "ferry worker: --snapshot-part-size-mib (FERRY_SNAPSHOT_PART_SIZE_MIB): input should be a valid integer, "
        "unable to parse string as an integer (got 'lots' from FERRY_SNAPSHOT_PART_SIZE_MIB)",
    ),
    (
        ["worker"],
        {"FERRY_SNAPSHOT_COMPRESSION": "10"},
        "ferry worker: --snapshot-compression (FERRY_SNAPSHOT_COMPRESSION): input should be less than or equal "
        "to 9 (got '10' from FERRY_SNAPSHOT_COMPRESSION)",
    ),
    (
        ["watcher"],
        {"FERRY_DELETION_TIMEOUT": "-60"},
        "ferry watcher: --deletion-timeout (FERRY_DELETION_TIMEOUT): input should be greater than 0 "
        "(got '-60' from FERRY_DELETION_TIMEOUT)",
    ),
    (
        ["watcher", "--log-format=xml"],
        {},
        "ferry watcher: --log-format (FERRY_LOG_FORMAT): input should be 'json' or 'text' "
        "(got 'xml' from --log-format)",
    ),
    (
        ["watcher"],
        {"FERRY_HEALTH_ADDRESS": "8080"},
        "ferry watcher: --health-address (FERRY_HEALTH_ADDRESS): should be host:port, e.g. 0.0.0.0:8080, "
        "with a port from 1 to 65535 (got '8080' from FERRY_HEALTH_ADDRESS)",
    ),
    (
        ["watcher", "--kubeconfig=/no/such/kubeconfig"],
        {},
        "ferry watcher: --kubeconfig (FERRY_KUBECONFIG, KUBECONFIG): Path does not point to a file "
        "(got '/no/such/kubeconfig' from --kubeconfig)",
    ),
    (
        ["watcher", "--lease-renew-deadline=20"],
        {"FERRY_LEASE_DURATION": "15"},
        "ferry watcher: leader election needs --lease-retry-period < --lease-renew-deadline < --lease-duration, "
        "got 2.0 < 20.0 < 15.0 (set: FERRY_LEASE_DURATION='15', --lease-renew-deadline='20')",
    ),
]


# Values that pass for numbers but break the component long after it started: an interval a step's heartbeat timeout
# (30 s) cannot wait for, infinities and NaN (OverflowError, or a wait for ever, in a sleep or a timeout), and
# values so large that a sleep, a timedelta or a socket option overflows, after the worker connected to Temporal.
OUT_OF_BOUNDS = [
    (
        ["worker", "--heartbeat-interval=30"],
        {},
        "ferry worker: --heartbeat-interval (FERRY_HEARTBEAT_INTERVAL): should be at most 15 seconds, half of every "
        "step's heartbeat timeout (30 s): a step that heartbeats less often is timed out while it waits "
        "(got '30' from --heartbeat-interval)",
    ),
    (
        ["worker"],
        {"FERRY_POLL_INTERVAL": "45"},
        "ferry worker: --poll-interval (FERRY_POLL_INTERVAL): should be at most 15 seconds, half of every step's "
        "heartbeat timeout (30 s): a step that heartbeats less often is timed out while it waits "
        "(got '45' from FERRY_POLL_INTERVAL)",
    ),
    (
        ["worker", "--heartbeat-interval=inf"],
        {},
        "ferry worker: --heartbeat-interval (FERRY_HEARTBEAT_INTERVAL): input should be a finite number "
        "(got 'inf' from --heartbeat-interval)",
    ),
    (
        ["worker"],
        {"FERRY_REPLICATION_POLL_INTERVAL": "inf"},
        "ferry worker: --replication-poll-interval (FERRY_REPLICATION_POLL_INTERVAL): input should be a finite "
        "number (got 'inf' from FERRY_REPLICATION_POLL_INTERVAL)",
    ),
    (
        ["worker", "--graceful-shutdown=1e300"],
        {},
        "ferry worker: --graceful-shutdown (FERRY_GRACEFUL_SHUTDOWN): input should be less than or equal to 3600 "
        "(got '1e300' from --graceful-shutdown)",
    ),
    (
        ["worker"],
        {"FERRY_GRACEFUL_SHUTDOWN": "inf"},
        "ferry worker: --graceful-shutdown (FERRY_GRACEFUL_SHUTDOWN): input should be a finite number "
        "(got 'inf' from FERRY_GRACEFUL_SHUTDOWN)",
    ),
    (
        ["worker", "--progress-interval=nan"],
        {},
        "ferry worker: --progress-interval (FERRY_PROGRESS_INTERVAL): input should be a finite number "
        "(got 'nan' from --progress-interval)",
    ),
    (
        ["worker", "--postgres-keepalives-count=1000"],
        {},
        "ferry worker: --postgres-keepalives-count (FERRY_POSTGRES_KEEPALIVES_COUNT): input should be less than or "
        "equal to 127 (got '1000' from --postgres-keepalives-count)",
    ),
    (
        ["worker", "--max-concurrent-activities=100000000000000000000"],
        {},
        "ferry worker: --max-concurrent-activities (FERRY_MAX_CONCURRENT_ACTIVITIES): input should be less than or "
        "equal to 1000 (got '100000000000000000000' from --max-concurrent-activities)",
    ),
    (
        ["watcher"],
        {"FERRY_DELETION_TIMEOUT": "1e300"},
        "ferry watcher: --deletion-timeout (FERRY_DELETION_TIMEOUT): input should be less than or equal to 2592000 "
        "(got '1e300' from FERRY_DELETION_TIMEOUT)",
    ),
    (
        ["watcher", "--lease-duration=inf"],
        {},
        "ferry watcher: --lease-duration (FERRY_LEASE_DURATION): input should be a finite number "
        "(got 'inf' from --lease-duration)",
    ),
    (
        ["watcher", "--resync-interval=nan"],
        {},
        "ferry watcher: --resync-interval (FERRY_RESYNC_INTERVAL): input should be a finite number "
        "(got 'nan' from --resync-interval)",
    ),
]
BAD_VALUES += OUT_OF_BOUNDS


@pytest.mark.parametrize(("argv", "environ", "message"), BAD_VALUES, ids=[" ".join([*c[0], *c[1]]) for c in BAD_VALUES])
def test_a_bad_value_ends_the_command_with_one_line_naming_the_setting_and_exit_code_2(
    argv: list[str],
    environ: dict[str, str],
    message: str,
    clean_environment: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environ.items():
        clean_environment.setenv(name, value)

    code, lines = run_cli(argv, capsys)

    assert code == 2
    assert lines == [message]


def test_a_secret_in_a_bad_combination_is_not_repeated(
    clean_environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_environment.setenv("FERRY_TEMPORAL_API_KEY", "s3cr3t-key")

    code, lines = run_cli(["worker", f"--temporal-tls-cert={KUBECONFIG}"], capsys)

    assert code == 2
    assert lines == [
        "ferry worker: the TLS client certificate and its key go together: set both or neither "
        f"(set: --temporal-tls-cert='{KUBECONFIG}', FERRY_TEMPORAL_API_KEY)"
    ]
