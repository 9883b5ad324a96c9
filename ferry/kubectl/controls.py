"""Controls from the plugin: the same annotations a person writes with `kubectl annotate`, signed by the caller.

Who the caller is comes from the API server (a SelfSubjectReview, as `kubectl auth
whoami` asks), not from a flag, so the saga records the identity the cluster
authenticated. The annotation's value must be what the watcher accepts (watcher/controls.py:
`<who>` or `<who>: <reason>`, <who> up to 63 of letters, digits and @._+-), so a user
name is cut down to that alphabet (`system:serviceaccount:ci:deployer` becomes
`system.serviceaccount.ci.deployer`). The admission policy deploy/admission/controls.yaml
accepts no other signature and repeats this rule in CEL: change both together
(tests/deploy/test_admission.py compares them).

The watcher answers in status.controls: once `acknowledged[<annotation>]` holds the value
written here, `message` is the saga's answer, and the Event it recorded with that message
says whether the saga took the control (ControlAccepted) or not (ControlRefused,
InvalidControl).
"""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from ferry.api.migration import CONTROL_PREFIX, GROUP, PLURAL, VERSION
from ferry.api.saga import Signal
from ferry.kubectl.cluster import Cluster
from ferry.kubectl.errors import Exit, PluginError

CONTROLS = tuple(signal.value for signal in Signal)
MAX_WHO = 63
MAX_REASON = 256
"""The watcher refuses a longer reason."""
EVENT_MESSAGE_CUT = 1000
"""An Event message this long may have been cut short (Events keep about 1 KiB of message)."""
POLL = 0.5
"""Seconds between two looks at the Migration's status while waiting for the watcher's answer."""
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9@._+-]+")


def annotation_name(control: str) -> str:
    return f"{CONTROL_PREFIX}{control}"


def who_from_username(username: str) -> str:
    """The user name in the alphabet of an annotation value: other characters become '.', at most 63."""
    who = _NOT_ALLOWED.sub(".", username).strip(".@_+-")[:MAX_WHO]
    return who or "unknown"


def control_value(who: str, reason: str, previous: set[str], now: datetime) -> str:
    """`<who>` or `<who>: <reason>`; made new (the time appended to the reason) when it was given before.

    A value the watcher has already seen would be taken for the same control, and ignored.
    """
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON:
        raise PluginError(f"the reason is {len(reason)} characters long; ferry keeps at most {MAX_REASON}")
    value = f"{who}: {reason}" if reason else who
    if value in previous:
        again = f"again at {now:%Y-%m-%dT%H:%M:%SZ}"
        value = f"{who}: {reason} ({again})" if reason else f"{who}: {again}"
    return value


def whoami(cluster: Cluster) -> str:
    """The user name the API server authenticated this caller as."""
    review = cluster.call(
        "a SelfSubjectReview (who am I)",
        k8s.AuthenticationV1Api(cluster.api).create_self_subject_review,
        k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"),
    )
    user = review.status.user_info if review.status else None
    if user is None or not user.username:
        raise PluginError("the API server did not say who you are (SelfSubjectReview): cannot sign the control")
    return str(user.username)


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the watcher said about one control."""

    control: str
    annotation: str
    value: str
    accepted: bool
    message: str
    reason: str
    """The Event's reason: ControlAccepted, ControlRefused or InvalidControl."""

    @property
    def code(self) -> Exit:
        return Exit.OK if self.accepted else Exit.ERROR

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def send(cluster: Cluster, namespace: str, name: str, control: str, reason: str, timeout: float) -> Answer:
    """Annotates the Migration with the control, signed by the caller, and waits for the watcher's answer."""
    migration = cluster.migration(namespace, name)
    key = annotation_name(control)
    annotations = migration["metadata"].get("annotations") or {}
    acknowledged = ((migration.get("status") or {}).get("controls") or {}).get("acknowledged") or {}
    previous = {v for v in (annotations.get(key), acknowledged.get(key)) if v}
    value = control_value(who_from_username(whoami(cluster)), reason, previous, datetime.now(UTC))
    custom = k8s.CustomObjectsApi(cluster.api)
    cluster.call(
        f"Migration {namespace}/{name}", custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
        name, {"metadata": {"annotations": {key: value}}}, _content_type="application/merge-patch+json",
    )  # fmt: skip
    uid = migration["metadata"]["uid"]
    deadline = time.monotonic() + timeout
    while True:
        current = cluster.migration(namespace, name)
        controls = (current.get("status") or {}).get("controls") or {}
        if (controls.get("acknowledged") or {}).get(key) == value:
            message = str(controls.get("message") or "")
            return _answer(cluster, namespace, uid, control, key, value, message)
        if time.monotonic() >= deadline:
            raise PluginError(
                f"the watcher did not answer {key}={value!r} within {timeout:.0f}s: is ferry's watcher running "
                f"and watching namespace {namespace}? The annotation stays; see `kubectl describe migration "
                f"{name} -n {namespace}` later",
                Exit.NO_ANSWER,
            )
        time.sleep(POLL)


def _answer(cluster: Cluster, namespace: str, uid: str, control: str, key: str, value: str, message: str) -> Answer:
    events = cluster.call(
        "the Migration's Events", k8s.CoreV1Api(cluster.api).list_namespaced_event, namespace,
        field_selector=f"involvedObject.uid={uid}",
    )  # fmt: skip
    reason = outcome_reason([(e.reason or "", e.message or "") for e in events.items], key, message)
    return Answer(control, key, value, reason == "ControlAccepted", message, reason)


def outcome_reason(events: list[tuple[str, str]], key: str, message: str) -> str:
    """The reason of the watcher's Event for the answer `message` to the control `key`.

    The watcher records `<key>: <message>` as ControlAccepted or ControlRefused, and an invalid
    value's `message` as InvalidControl (Event messages may be cut short). Without such an
    Event the answer counts as accepted: the watcher acknowledged it.
    """
    said = f"{key}: {message}"
    for reason, text in events:
        if reason in ("ControlAccepted", "ControlRefused") and _same(text, said):
            return reason
        if reason == "InvalidControl" and _same(text, message):
            return reason
    return "ControlAccepted"


def _same(recorded: str, said: str) -> bool:
    """Whether an Event's message is `said`, or its beginning when the Event had to cut it short."""
    return recorded == said or (len(recorded) >= EVENT_MESSAGE_CUT and said.startswith(recorded))
