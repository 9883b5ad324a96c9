"""Settings of the activities: typed objects the worker's settings hold, one per kind of activity.

They are frozen dataclasses (pydantic's, which check each value's type and limits when
one is made); every field is also a knob of `ferry worker` (worker/settings.py), with
its docstring as its --help.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass

from ferry.api.saga import HEARTBEAT_TIMEOUT_SECONDS
from ferry.configuration.knobs import SETTINGS, Knob

MIB = 1024 * 1024
HOUR = 3600.0

MAX_HEARTBEAT_INTERVAL = HEARTBEAT_TIMEOUT_SECONDS / 2
"""The longest interval between a waiting step's heartbeats, or between two polls (each poll heartbeats): half of
every step's heartbeat timeout, so a heartbeat is never late even when the poll or the beat itself takes a while."""


def _within_heartbeat_timeout(interval: float) -> float:
    if interval > MAX_HEARTBEAT_INTERVAL:
        raise ValueError(
            f"should be at most {MAX_HEARTBEAT_INTERVAL:g} seconds, half of every step's heartbeat timeout "
            f"({HEARTBEAT_TIMEOUT_SECONDS} s): a step that heartbeats less often is timed out while it waits"
        )
    return interval


HeartbeatInterval = Annotated[float, Field(gt=0), AfterValidator(_within_heartbeat_timeout)]
"""Seconds between two heartbeats (or two polls, each heartbeating) of a waiting step."""


@dataclass(frozen=True, config=SETTINGS)
class KubeActivitySettings:
    """How the Kubernetes-side activities poll, label their writes and link to Temporal."""

    poll_interval: HeartbeatInterval = 1.0
    """Seconds between two polls while an activity waits for the cluster (readiness, endpoints, deletion); at most
    15, half of a step's heartbeat timeout."""

    temporal_ui_url: Annotated[str | None, Knob(section="Temporal")] = None
    """Base URL of the Temporal Web UI, e.g. http://localhost:8233. When set, status.workflow.url
    links to the run: {ui}/namespaces/{ns}/workflows/{id}/{run_id}/history."""

    field_manager: str = "ferry"
    """Field manager of ferry's server-side applies, as `kubectl get -o yaml --show-managed-fields` shows it."""

    reporting_instance: str = dataclasses.field(default_factory=socket.gethostname)
    """reportingInstance of the Events ferry records: which worker wrote them (default: the host name)."""


def default_streams(cpus: int | None) -> int:
    """The snapshot streams a worker with `cpus` CPUs runs by default: one per CPU, up to 8."""
    return max(1, min(8, cpus or 1))


def _s3_part_size(size: int) -> int:
    if not 5 * MIB <= size <= 5 * 1024 * MIB:
        raise ValueError("should be from 5 MiB to 5 GiB, the sizes S3 allows for a part")
    return size


@dataclass(frozen=True, config=SETTINGS)
class DataActivitySettings:
    """How the data-driver and snapshot activities reach databases, run the PostgreSQL tools and use S3."""

    postgres_bindir: Path | None = None
    """Folder holding pg_dump and pg_restore (default: of every folder on the PATH and /usr/lib/postgresql/*/bin,
    the one whose pg_dump has the highest major version). Use tools of the newest major version among source and
    target: pg_dump refuses newer servers."""

    connect_attempts: Annotated[int, Knob(flag="postgres-connect-attempts"), Field(ge=1, le=100)] = 5
    """Connection attempts to a database before it counts as unreachable (a permanent failure of the step)."""

    connect_retry_delay: Annotated[float, Knob(flag="postgres-connect-retry-delay"), Field(ge=0, le=300)] = 2.0
    """Seconds between two connection attempts."""

    connect_timeout: Annotated[int, Knob(flag="postgres-connect-timeout"), Field(ge=1, le=3600)] = 10
    """Seconds one connection attempt to a database may take, answer included (libpq's connect_timeout, also
    given to pg_dump and pg_restore): a server that accepts the connection and never answers fails the attempt."""

    tcp_keepalives_idle: Annotated[int, Knob(flag="postgres-keepalives-idle"), Field(ge=1, le=32767)] = 30
    """Seconds a database connection may be idle before TCP keepalives probe the server (at most 32767, Linux's
    limit: more would fail every connection)."""

    tcp_keepalives_interval: Annotated[int, Knob(flag="postgres-keepalives-interval"), Field(ge=1, le=32767)] = 10
    """Seconds between two unanswered keepalive probes (at most 32767, Linux's limit)."""

    tcp_keepalives_count: Annotated[int, Knob(flag="postgres-keepalives-count"), Field(ge=1, le=127)] = 3
    """Unanswered keepalive probes after which a database connection counts as dead (at most 127, Linux's limit)."""

    tcp_user_timeout: Annotated[int, Knob(flag="postgres-tcp-user-timeout"), Field(ge=1, le=3600)] = 60
    """Seconds data sent to a database may stay unacknowledged before the connection counts as dead (libpq's
    tcp_user_timeout). With the keepalives, a server that vanishes mid-query fails the query instead of hanging."""

    session_end_timeout: Annotated[float, Knob(flag="freeze-session-end-timeout"), Field(ge=0, le=HOUR)] = 10.0
    """Seconds freeze waits for each ended session to be gone (its open transaction rolled back)."""

    dump_compression: Annotated[int, Knob(flag="snapshot-compression"), Field(ge=0, le=9)] = 0
    """pg_dump's compression level, 0 to 9; 0, none, by default. The dump, the upload and the restore run at once
    while writes are stopped, and compressing costs the dump and the restore more CPU than the larger upload costs:
    on 2 cores, level 1 made the snapshot step of 1 GB 3 to 7 seconds slower (docs/performance.md). Level 1 keeps
    most of level 6's gain at a fraction of its CPU: choose it when the network to S3 is the limit, or to keep
    smaller snapshots (about 2.7 times smaller in that test)."""

    part_size: Annotated[
        int, Knob(flag="snapshot-part-size-mib", unit=MIB, unit_name="MiB"), AfterValidator(_s3_part_size)
    ] = 16 * MIB
    """Smallest size of a part of the snapshot's multipart upload, from 5 MiB (S3's minimum). Parts are
    larger for a large source (its size read once it is frozen, spread over half of S3's 10,000 parts)
    and grow as a dump outgrows that, so no snapshot runs out of parts (see activities/parts.py)."""

    snapshot_streams: Annotated[int, Knob(flag="snapshot-streams"), Field(ge=1, le=64)] = dataclasses.field(
        default_factory=lambda: default_streams(os.cpu_count())
    )
    """Streams of a snapshot in mode Snapshot when its Migration's spec.driver.parallelism does not say (default:
    one per CPU of the worker, up to 8). Each stream dumps, uploads and restores some of the largest tables at once,
    and its pg_dump, pg_restore and psql run on the worker, which hashes and relays its bytes; the indexes are then
    built by as many sessions. On 2 cores, 2 streams took the snapshot step of 1 GB from 22.5 s to 17.0 s
    (docs/performance.md)."""

    snapshot_max_streams: Annotated[int, Knob(flag="snapshot-max-streams"), Field(ge=1, le=64)] = 8
    """The most streams one snapshot runs on this worker, whatever spec.driver.parallelism asks (up to 64): each
    stream is a pg_dump and a psql on the worker, with threads and a share of the snapshot's memory (the worker's
    peak grew by 55 to 90 MiB per stream, docs/performance.md), so a Migration's author cannot make the worker
    hold more than this many. The worker's own default number of streams is taken down to it as well."""

    parallel_min_size: Annotated[
        int, Knob(flag="snapshot-parallel-min-mib", unit=MIB, unit_name="MiB"), Field(ge=0)
    ] = 64 * MIB
    """A source smaller than this is snapshotted in one stream whatever the parallelism: starting several costs
    more than it saves."""

    analyze_sessions: Annotated[int, Knob(flag="analyze-sessions"), Field(ge=1, le=64)] = 4
    """Sessions that gather the target's planner statistics at once after a restore (ANALYZE, while writes are
    stopped): ANALYZE mostly waits on the pages it samples, so a few sessions overlap those waits."""

    upload_concurrency: Annotated[int, Knob(flag="snapshot-upload-concurrency"), Field(ge=1, le=64)] = 4
    """Parts uploaded at once while pg_dump goes on writing the next ones; each is held in memory."""

    upload_memory: Annotated[int, Knob(flag="snapshot-memory-mib", unit=MIB, unit_name="MiB"), Field(ge=10 * MIB)] = (
        256 * MIB
    )
    """Memory the parts of one snapshot may hold (the part being read and those in flight): fewer parts
    are uploaded at once when they are large, never fewer than one. A snapshot holds at most the larger
    of this and two parts; in N streams, each stream holds at most the larger of a 1/N share of this (at
    least 10 MiB) and two of its own parts, and N is at most the worker's maximum of streams."""

    max_object_size: Annotated[
        int, Knob(flag="snapshot-max-object-size-gib", unit=1024 * MIB, unit_name="GiB"), Field(ge=1)
    ] = 5 * 1024 * 1024 * MIB
    """The largest object the snapshot store takes (S3's limit is 5 TiB; some stores allow less). The
    precheck refuses a source larger than this before anything changes."""

    s3_connect_timeout: Annotated[float, Knob(flag="s3-connect-timeout"), Field(gt=0, le=HOUR)] = 10.0
    """Seconds to wait for the S3 endpoint to accept a connection."""

    s3_read_timeout: Annotated[float, Knob(flag="s3-read-timeout"), Field(gt=0, le=HOUR)] = 60.0
    """Seconds to wait for S3's answer once a request (or a part) is sent: an endpoint that accepts connections
    and never answers fails the request after this long, instead of keeping the source frozen."""

    s3_attempts: Annotated[int, Knob(flag="s3-attempts"), Field(ge=1, le=100)] = 3
    """Attempts of one S3 request (botocore's own retries) before the step fails and the saga's next attempt."""

    heartbeat_interval: HeartbeatInterval = 5.0
    """Seconds between heartbeats while an activity is blocked (on pg_dump, pg_restore, S3 or a query); at most 15,
    half of a step's heartbeat timeout."""

    progress_interval: Annotated[float, Field(ge=0, le=HOUR)] = 5.0
    """Seconds between two writes of a running snapshot's, migrate's or verify's progress into its Migration's
    status.progress (bytes or rows done, throughput, time left), which `kubectl get mig -w` shows; 0 writes none."""

    replication_poll_interval: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Seconds between two looks at the logical replication's progress (mode Online: replicate, catch-up, and the
    watch while the saga waits before the freeze), and the pause before a change to the source's tables tries again
    for a lock; at most 60."""

    replication_stall_timeout: Annotated[float, Field(gt=0)] = 60.0
    """Seconds the replication may stay in trouble, without a break, while the target applies nothing, before
    replicate, catch-up or the watch while the saga waits before the freeze fails for good with ReplicationBroken (mode
    Online). Trouble: its workers' errors rising, or its subscription not streaming from the source (no apply worker,
    or the slot not active); the watch also counts the subscription disabled, or the target unreachable. The trouble
    ends when anything is applied, or at a look that finds nothing wrong once half this long has passed since the last
    bad one (at least 15 s and two poll intervals, so that an apply worker failing again and again, which looks
    healthy between its failures, stays in trouble): one bad look on an idle source, whose slot stands still for
    hours, fails nothing."""

    def streams_for(self, parallelism: int | None) -> int:
        """The streams a snapshot runs: spec.driver.parallelism, else --snapshot-streams, at most
        --snapshot-max-streams (a source too small or with one table still goes in one)."""
        return min(parallelism or self.snapshot_streams, self.snapshot_max_streams)
