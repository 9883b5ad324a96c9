"""Connections to Temporal and Kubernetes, made the same way by the worker, the watcher and the CLI.

Every Temporal client uses the pydantic data converter, because every workflow and
activity payload is a pydantic model from ferry.api.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client, Interceptor, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from ferry.api.saga import TASK_QUEUE
from ferry.kube_requests import DEFAULT_TIMEOUTS, BoundedApiClient, RequestTimeouts


@dataclasses.dataclass(frozen=True)
class TemporalSettings:
    """How to reach the Temporal frontend."""

    address: str = "localhost:7233"
    """host:port of the Temporal frontend (gRPC)."""
    namespace: str = "default"
    """Temporal namespace the migration workflows live in."""
    tls_cert: Path | None = None
    """Client certificate (PEM) for mutual TLS; with tls_key."""
    tls_key: Path | None = None
    """Private key (PEM) of tls_cert."""
    tls_ca: Path | None = None
    """CA bundle (PEM) that signed the server's certificate; TLS is on when any TLS file is set."""
    api_key: str | None = None
    """API key (Temporal Cloud); implies TLS."""

    def tls(self) -> TLSConfig | bool:
        if not (self.tls_cert or self.tls_key or self.tls_ca):
            return self.api_key is not None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--temporal-tls-cert and --temporal-tls-key go together: set both or neither")
        return TLSConfig(
            client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
            client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
            server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
        )


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
        api_key=settings.api_key,
        tls=settings.tls(),
        data_converter=pydantic_data_converter,
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


def env(name: str, default: str | None = None) -> str | None:
    """A FERRY_-prefixed environment variable: every flag has one."""
    return os.environ.get(f"FERRY_{name}", default)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by the worker and the watcher: Temporal, the task queue, the Web UI, Kubernetes."""
    group = parser.add_argument_group("Temporal")
    group.add_argument(
        "--temporal-address",
        default=env("TEMPORAL_ADDRESS", "localhost:7233"),
        help="host:port of the Temporal frontend [FERRY_TEMPORAL_ADDRESS] (default: %(default)s)",
    )
    group.add_argument(
        "--temporal-namespace",
        default=env("TEMPORAL_NAMESPACE", "default"),
        help="Temporal namespace [FERRY_TEMPORAL_NAMESPACE] (default: %(default)s)",
    )
    group.add_argument(
        "--temporal-tls-cert",
        type=Path,
        default=env("TEMPORAL_TLS_CERT"),
        help="client certificate for mutual TLS [FERRY_TEMPORAL_TLS_CERT]",
    )
    group.add_argument(
        "--temporal-tls-key",
        type=Path,
        default=env("TEMPORAL_TLS_KEY"),
        help="private key of the client certificate [FERRY_TEMPORAL_TLS_KEY]",
    )
    group.add_argument(
        "--temporal-tls-ca",
        type=Path,
        default=env("TEMPORAL_TLS_CA"),
        help="CA bundle of the server's certificate; any TLS flag turns TLS on [FERRY_TEMPORAL_TLS_CA]",
    )
    group.add_argument(
        "--temporal-api-key",
        default=env("TEMPORAL_API_KEY"),
        help="API key, e.g. for Temporal Cloud; implies TLS [FERRY_TEMPORAL_API_KEY]",
    )
    group.add_argument(
        "--task-queue",
        default=env("TASK_QUEUE", TASK_QUEUE),
        help="task queue of the migration workflows [FERRY_TASK_QUEUE] (default: %(default)s)",
    )
    group.add_argument(
        "--temporal-ui-url",
        default=env("TEMPORAL_UI_URL"),
        help="base URL of the Temporal Web UI, linked from each Migration's status [FERRY_TEMPORAL_UI_URL]",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=env("KUBECONFIG") or os.environ.get("KUBECONFIG"),
        help="kubeconfig [FERRY_KUBECONFIG, KUBECONFIG] (default: in-cluster, else ~/.kube/config)",
    )


def temporal_settings(args: argparse.Namespace) -> TemporalSettings:
    return TemporalSettings(
        address=args.temporal_address,
        namespace=args.temporal_namespace,
        tls_cert=args.temporal_tls_cert,
        tls_key=args.temporal_tls_key,
        tls_ca=args.temporal_tls_ca,
        api_key=args.temporal_api_key,
    )
