"""What the status says of a failed attempt: the innermost message, and for a timeout what the activity waited for."""

from __future__ import annotations

from temporalio.exceptions import TimeoutError as TimeoutFailure
from temporalio.exceptions import TimeoutType

from workflows.saga import error_text


def test_a_step_that_timed_out_says_what_it_last_waited_for() -> None:
    waited = {"waiting_for": "StatefulSet shop/orders-db-18 Ready: Pod orders-db-18-0 is not scheduled", "ready": 0}
    timed_out = TimeoutFailure(
        "activity StartToClose timeout", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[waited]
    )

    assert error_text(timed_out) == (
        "activity StartToClose timeout; it was waiting for StatefulSet shop/orders-db-18 Ready: Pod orders-db-18-0 "
        "is not scheduled (ready 0)"
    )


def test_a_timeout_without_heartbeats_or_with_others_says_the_timeout_alone() -> None:
    for details in ([], ["rows copied: 10"], [{"rows": 10}]):
        timed_out = TimeoutFailure(
            "activity StartToClose timeout", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=details
        )
        assert error_text(timed_out) == "activity StartToClose timeout", details
