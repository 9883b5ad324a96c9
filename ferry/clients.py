"""Connections to Temporal and Kubernetes, made the same way by the worker, the watcher, the CLI and the tests.

Every Temporal client uses the pydantic data converter, because every workflow and
activity payload is a pydantic model from ferry.api, with the failure converter that
scrubs every failure's message (ferry/failures.py): `connect_temporal` is how ferry
makes a client, and `data_converter` is what a test environment that makes its own
(WorkflowEnvironment) is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Self

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from pydantic import FilePath, SecretStr, model_validator
from pydantic.dataclasses import dataclass
from temporalio.client import Client, Interceptor, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime

from ferry.configuration.knobs import SETTINGS, Knob
from ferry.failures import ScrubbingFailureConverter
from ferry.kube_requests import DEFAULT_TIMEOUTS, BoundedApiClient, RequestTimeouts


@dataclass(frozen=True, config=SETTINGS)
class TemporalSettings:
    """How to reach the Temporal frontend."""

    address: str = "localhost:7233"
    """host:port of the Temporal frontend (gRPC)."""
    namespace: str = "default"
    """Temporal namespace the migration workflows live in."""
    tls_cert: FilePath | None = None
    """Client certificate (PEM) for mutual TLS, with its key; any TLS file turns TLS on."""
    tls_key: FilePath | None = None
    """Private key (PEM) of the client certificate."""
    tls_ca: FilePath | None = None
    """CA bundle (PEM) that signed the server's certificate; any TLS file turns TLS on."""
    api_key: Annotated[SecretStr | None, Knob(secret=True)] = None
    """API key, e.g. for Temporal Cloud; implies TLS. Pass it from a Secret, never in a ConfigMap."""

    @model_validator(mode="after")
    def _certificate_with_its_key(self) -> Self:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("the TLS client certificate and its key go together: set both or neither")
        return self

    def tls(self) -> TLSConfig | bool:
        if not (self.tls_cert or self.tls_key or self.tls_ca):
            return self.api_key is not None
        return TLSConfig(
            client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
            client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
            server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
        )


def data_converter() -> DataConverter:
    """The converter of every payload ferry sends through Temporal: pydantic models as JSON, failures scrubbed."""
    return dataclasses.replace(pydantic_data_converter, failure_converter_class=ScrubbingFailureConverter)


async def connect_temporal(
    settings: TemporalSettings,
    *,
    identity: str | None = None,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """A client with ferry's data converter; `runtime` carries metrics, `interceptors` tracing."""
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        tls=settings.tls(),
        data_converter=data_converter(),
        identity=identity,
        runtime=runtime,
        interceptors=interceptors,
    )


def kubernetes_client(
    kubeconfig: Path | None, *, connections: int = 16, timeouts: RequestTimeouts = DEFAULT_TIMEOUTS
) -> k8s.ApiClient:
    """An API client from the given kubeconfig, else in-cluster config, else ~/.kube/config.

    `connections` sizes the connection pool: one per thread that calls the API at once.
    `timeouts` bounds every call that does not pass its own `_request_timeout` (see kube_requests).
    """
    configuration = k8s.Configuration()
    if kubeconfig is not None:
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return BoundedApiClient(configuration, timeouts)
