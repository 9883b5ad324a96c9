"""S3 clients: made once per endpoint, credentials and encryption, and reused by every activity of the process."""

from __future__ import annotations

from typing import Any

from activities import s3
from activities.secrets import S3Credentials
from activities.settings import DataActivitySettings
from ferry.api.migration import SnapshotSpec

SETTINGS = DataActivitySettings()


def _spec(**changes: Any) -> SnapshotSpec:
    return SnapshotSpec.model_validate(
        {"bucket": "snapshots", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "s3", **changes}
    )


def _credentials(secret_access_key: str = "secret-1") -> S3Credentials:
    return S3Credentials(access_key_id="ferry", secret_access_key=secret_access_key, secret="orders/s3")


def _put_object_parameters(client: Any) -> dict[str, Any]:
    """The parameters of a PutObject once the client's handlers have run (nothing is sent)."""
    params: dict[str, Any] = {"Bucket": "snapshots", "Key": "dump"}
    model = client.meta.service_model.operation_model("PutObject")
    client.meta.events.emit("before-parameter-build.s3.PutObject", params=params, model=model, context={})
    return params


def test_activities_of_the_same_migration_share_one_client() -> None:
    first = s3.client(_spec(), _credentials(), SETTINGS)

    assert s3.client(_spec(), _credentials(), SETTINGS) is first


def test_a_shared_client_keeps_connections_for_many_uploads_at_once() -> None:
    shared = s3.client(_spec(), _credentials(), SETTINGS)

    ten_snapshots_uploading_and_restoring = 10 * (SETTINGS.upload_concurrency + 1)
    assert shared.meta.config.max_pool_connections >= ten_snapshots_uploading_and_restoring


def test_credentials_changed_in_the_secret_get_a_client_that_signs_with_them() -> None:
    before = s3.client(_spec(), _credentials("secret-1"), SETTINGS)
    after = s3.client(_spec(), _credentials("secret-2"), SETTINGS)

    assert after is not before
    assert after._get_credentials().secret_key == "secret-2"
    assert before._get_credentials().secret_key == "secret-1"


def test_another_endpoint_or_region_gets_its_own_client() -> None:
    plain = s3.client(_spec(), _credentials(), SETTINGS)
    elsewhere = s3.client(_spec(endpoint="http://127.0.0.1:10"), _credentials(), SETTINGS)
    other_region = s3.client(_spec(region="eu-west-1"), _credentials(), SETTINGS)

    assert len({id(plain), id(elsewhere), id(other_region)}) == 3
    assert elsewhere.meta.endpoint_url == "http://127.0.0.1:10"
    assert other_region.meta.region_name == "eu-west-1"


def test_encryption_asked_by_one_migration_reaches_only_its_client() -> None:
    encrypted = s3.client(_spec(serverSideEncryption={"type": "AES256"}), _credentials(), SETTINGS)
    plain = s3.client(_spec(), _credentials(), SETTINGS)

    assert encrypted is not plain
    assert _put_object_parameters(encrypted)["ServerSideEncryption"] == "AES256"
    assert "ServerSideEncryption" not in _put_object_parameters(plain)


def test_the_cache_keeps_the_most_recently_used_clients_up_to_its_limit() -> None:
    made: list[str] = []
    clients = s3._Clients(limit=2)

    def get(key: str) -> object:
        def make(_: object) -> Any:
            made.append(key)
            return object()

        return clients.get(key, make)

    a = get("a")
    get("b")
    assert get("a") is a  # "a" is now the most recently used: "b" goes first
    get("c")
    assert get("a") is a
    get("b")

    assert made == ["a", "b", "c", "b"]
