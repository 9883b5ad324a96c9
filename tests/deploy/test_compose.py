"""docker-compose.yml: Temporal on PostgreSQL with its UI, S3, and ferry's worker and watcher from the Dockerfile.

No Docker engine runs here, so the file is read, not started; every check compares it
with what it must agree with: ferry's real parser (subcommands and the FERRY_ variables
they read), ferry's search attributes, and the services' own health checks.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from ferry.api import search_attributes
from tests.deploy.files import COMPOSE, subcommands, variables_read_by

pytestmark = pytest.mark.unit

FERRY = ("worker", "watcher")
"""The services running ferry itself, each named after its subcommand."""
WAIT_CONDITIONS = {"service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return loaded


def test_it_runs_temporal_on_postgresql_its_web_ui_s3_and_ferrys_worker_and_watcher(
    services: dict[str, Any],
) -> None:
    assert {"temporal", "temporal-postgresql", "temporal-ui", "s3", *FERRY} <= set(services)
    temporal = services["temporal"]
    assert temporal["image"].startswith("temporalio/auto-setup:")
    assert temporal["environment"]["DB"] == "postgres12"
    assert temporal["environment"]["POSTGRES_SEEDS"] == "temporal-postgresql"
    assert services["temporal-postgresql"]["image"].startswith("postgres:")
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_every_image_is_pinned_to_a_version(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if "image" not in service:
            assert service["build"] == ".", f"{name} neither names an image nor builds ferry's"
            continue
        repository, _, tag = service["image"].rpartition(":")
        assert repository, f"{name}: {service['image']} has no tag"
        assert "/" not in tag, f"{name}: {service['image']} has no tag"
        assert tag != "latest", f"{name}: {service['image']} is not pinned"
        assert re.search(r"\d", tag), f"{name}: {service['image']} names no version"


def test_temporal_its_ui_and_s3_are_published_on_their_usual_ports(services: dict[str, Any]) -> None:
    published = {name: [str(port) for port in service.get("ports", [])] for name, service in services.items()}

    assert "7233:7233" in published["temporal"]
    assert "8080:8080" in published["temporal-ui"]
    assert "9000:9000" in published["s3"]


def test_services_start_only_after_what_they_need_is_healthy_or_done(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for needed, how in service.get("depends_on", {}).items():
            condition = how["condition"]
            assert condition in WAIT_CONDITIONS, f"{name} waits for {needed} only to start ({condition})"
            if condition == "service_healthy":
                assert services[needed].get("healthcheck", {}).get("test"), f"{needed} has no health check"
    assert services["temporal"]["depends_on"]["temporal-postgresql"]["condition"] == "service_healthy"
    for name in FERRY:
        assert services[name]["depends_on"]["temporal"]["condition"] == "service_healthy"
    # The worker's snapshots need the bucket, which needs S3 up.
    assert services["worker"]["depends_on"]["s3-buckets"]["condition"] == "service_completed_successfully"
    assert services["s3-buckets"]["depends_on"]["s3"]["condition"] == "service_healthy"


def test_the_stateful_services_have_health_checks(services: dict[str, Any]) -> None:
    for name in ("temporal-postgresql", "temporal", "s3"):
        assert services[name]["healthcheck"]["test"], f"{name} has no health check"


def test_every_long_running_service_restarts_and_every_one_off_job_retries_on_failure(
    services: dict[str, Any],
) -> None:
    jobs = {
        needed
        for service in services.values()
        for needed, how in service.get("depends_on", {}).items()
        if how["condition"] == "service_completed_successfully"
    }
    for name, service in services.items():
        expected = "on-failure" if name in jobs else "unless-stopped"
        assert service.get("restart") == expected, f"{name}: restart {service.get('restart')!r}"


def test_ferrys_search_attributes_are_registered_before_ferry_starts(services: dict[str, Any]) -> None:
    script = " ".join(services["temporal-search-attributes"]["command"])
    loop = re.search(r"for name in ([\w ]+);", script)
    assert loop is not None

    assert set(loop.group(1).split()) == {key.name for key in search_attributes.ALL}
    assert "--type Keyword" in script
    for name in FERRY:
        assert services[name]["depends_on"]["temporal-search-attributes"]["condition"] == (
            "service_completed_successfully"
        )


@pytest.mark.parametrize("name", FERRY)
def test_ferrys_services_build_the_image_and_run_their_subcommand(services: dict[str, Any], name: str) -> None:
    service = services[name]

    assert service["build"] == "."
    assert service["command"] == [name]
    assert name in subcommands()


@pytest.mark.parametrize("name", FERRY)
def test_ferrys_services_set_only_variables_their_subcommand_reads(services: dict[str, Any], name: str) -> None:
    environment = services[name]["environment"]
    ferry_variables = {variable for variable in environment if variable.startswith("FERRY_")}

    assert ferry_variables, f"{name} sets no FERRY_ variable"
    assert ferry_variables <= variables_read_by(name), f"{name} sets variables ferry {name} ignores"
    assert environment["FERRY_TEMPORAL_ADDRESS"] == "temporal:7233"


@pytest.mark.parametrize("name", FERRY)
def test_ferrys_services_get_the_kubeconfig_read_only_where_ferry_looks_for_it(
    services: dict[str, Any], name: str
) -> None:
    service = services[name]
    mounts = [mount for mount in service["volumes"] if mount["target"] == service["environment"]["FERRY_KUBECONFIG"]]

    assert len(mounts) == 1, f"{name} mounts nothing at FERRY_KUBECONFIG"
    (mount,) = mounts
    assert mount["type"] == "bind"
    assert mount["read_only"] is True
    assert mount["source"].startswith("${FERRY_KUBECONFIG_FILE:?"), "a missing kubeconfig must stop compose, loudly"
