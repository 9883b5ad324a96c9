"""Custom search attributes ferry upserts on every migration workflow.

Registered on the Temporal server (the local stack does it at start; production
clusters with `temporal operator search-attribute create`), so runs can be filtered by
migration in the Web UI and the CLI, e.g. `FerryMigration = "orders-db"`.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

MIGRATION_NAMESPACE = SearchAttributeKey.for_keyword("FerryNamespace")
"""Kubernetes namespace of the Migration."""

MIGRATION_NAME = SearchAttributeKey.for_keyword("FerryMigration")
"""Name of the Migration."""

PHASE = SearchAttributeKey.for_keyword("FerryPhase")
"""The Migration's phase, as shown in its status."""

STEP = SearchAttributeKey.for_keyword("FerryStep")
"""The saga step running now (empty once finished)."""

ALL = (MIGRATION_NAMESPACE, MIGRATION_NAME, PHASE, STEP)
