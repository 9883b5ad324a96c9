"""The precheck's refusal of triggers that would fire on mode Online's target: every trigger named, up to a bound."""

from __future__ import annotations

from activities.postgres.replication_checks import SHOWN, replica_triggers

DATABASE = "database 'shop' on db:5432 (user 'app', Secret shop/source)"


def test_a_long_list_of_triggers_names_the_first_few_and_says_how_many_more() -> None:
    fired = [f"public.t{number:02}.audited (ALWAYS)" for number in range(SHOWN + 3)]

    refusal = replica_triggers(DATABASE, fired)

    assert f"public.t{SHOWN - 1:02}.audited (ALWAYS) and 3 more. " in refusal
    assert f"public.t{SHOWN:02}" not in refusal


def test_the_refusal_says_why_and_what_to_do() -> None:
    refusal = replica_triggers(DATABASE, ["public.notes.noted (ALWAYS)", "public.ledger.stamped (REPLICA)"])

    assert refusal.startswith(
        f"these triggers of {DATABASE} are enabled ALWAYS or REPLICA: public.notes.noted (ALWAYS), "
        "public.ledger.stamped (REPLICA). "
    )
    assert "so its effect would happen twice" in refusal
    assert "ALTER TABLE ... ENABLE TRIGGER name each ALWAYS one" in refusal
    assert "ALTER TABLE ... DISABLE TRIGGER name each REPLICA one" in refusal
    assert refusal.endswith("Or use spec.driver.mode Snapshot.")
