"""Failures that retrying cannot fix: activities raise them, the workflow's retry policies list them.

Temporal records an activity's exception under its class name; every retry policy in
the workflow names these types as non-retryable, so a failure of this kind goes
straight to the failure policy (roll back, or pause for a person) with its message.
Each message says what is wrong and what to do.
"""

from __future__ import annotations


class PermanentError(Exception):
    """Root of the failures that retrying cannot fix."""


class InvalidSpec(PermanentError):
    """The Migration asks for something impossible, e.g. a source StatefulSet that does not exist."""


class MissingSecret(PermanentError):
    """A Secret named in the Migration, or one of its keys, does not exist."""


class DatabaseUnreachable(PermanentError):
    """The database refused or never answered connections after the driver's own retries."""


class BadCredentials(PermanentError):
    """The database or S3 rejected the credentials from the Secret."""


class TlsMismatch(PermanentError):
    """The database's TLS and the Secret's disagree: its certificate does not verify with the Secret's CA, or one
    side requires encryption the other does not offer. Retrying asks the same server the same way."""


class BucketMissing(PermanentError):
    """The snapshot bucket does not exist or is not accessible."""


class SnapshotCorrupt(PermanentError):
    """The snapshot object does not match the checksum recorded when it was written."""


class VerificationMismatch(PermanentError):
    """Source and target hold different data; the message names the tables."""


class PermissionDenied(PermanentError):
    """The Kubernetes API server refused a call (403): ferry's ServiceAccount lacks a permission."""


class PrecheckFailed(PermanentError):
    """Checks made before anything changes found problems; the message lists every one of them."""


class WritesAfterFreeze(PermanentError):
    """The source committed writes after the freeze: the target may lack them, so traffic must not move."""


class WritesOnTarget(PermanentError):
    """The target took writes since traffic moved to it: switching traffic back would lose them, so it stays."""


class TargetVerified(PermanentError):
    """A late attempt of snapshot, migrate or replicate would empty or rewrite a target verify has marked: that target
    may be taking traffic, and only the undo (which checks for writes first) may empty it."""


class TargetNotVerified(PermanentError):
    """Traffic was about to move to a target that holds no mark of verify of this Migration: an undo emptied it since
    verify (a run reset to before switch-traffic), or the mark was removed by hand. Nothing says it holds the source's
    data, so the clients are not sent there."""


class ReplicationEnded(PermanentError):
    """A late attempt of replicate would publish the source or make a slot or subscription after the rollback (or
    catch-up) ended this Migration's replication: a slot nobody drops would keep the source's WAL forever."""


class Overtaken(PermanentError):
    """A late attempt of a Kubernetes step or undo found its object written by a later action of the same Migration
    (activities/fences.py), a late undo that would empty the target found it marked by a later verify
    (activities/postgres/unwritten.py, vouch), or a late snapshot found an object of the snapshot written by a later
    attempt (activities/postgres/snapshot_attempts.py): it changed nothing of what the later action did, since what it
    was about to do is no longer what the saga wants."""


class ReplicationBroken(PermanentError):
    """Mode Online: the target keeps failing to apply the source's changes (e.g. after a schema change on the source),
    does not stream from the source, or the source invalidated the replication slot."""


NON_RETRYABLE: tuple[type[PermanentError], ...] = (
    InvalidSpec,
    MissingSecret,
    DatabaseUnreachable,
    BadCredentials,
    BucketMissing,
    SnapshotCorrupt,
    VerificationMismatch,
    PermissionDenied,
    PrecheckFailed,
    WritesAfterFreeze,
    WritesOnTarget,
    TargetVerified,
    TargetNotVerified,
    Overtaken,
    TlsMismatch,
    ReplicationBroken,
    ReplicationEnded,
)
NON_RETRYABLE_TYPES: tuple[str, ...] = tuple(error.__name__ for error in NON_RETRYABLE)
