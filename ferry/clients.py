"""Connections to Temporal and Kubernetes, made the same way by the worker, the watcher, the CLI and the tests.

Every Temporal client uses the pydantic data converter, because every workflow and
activity payload is a pydantic model from ferry.api, with the failure converter that
scrubs every failure's message (ferry/failures.py): `connect_temporal` is how ferry
makes a client, and `data_converter` is what a test environment that makes its own
(WorkflowEnvironment) is given. With codec keys configured, the converter also encrypts
every payload and every failure's message and stack trace (ferry/codec), so all of
ferry's clients, which share these settings, read and write the same ciphertext.
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
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, Interceptor, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec, PayloadConverter
from temporalio.runtime import Runtime

from ferry.codec.encryption import EncryptionCodec
from ferry.codec.keys import CodecKeys, load_keys
from ferry.configuration.knobs import SETTINGS, Knob
from ferry.failures import ScrubbingFailureConverter
from ferry.kube_requests import DEFAULT_TIMEOUTS, BoundedApiClient, RequestTimeouts, request_retries


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
    codec_keys: Annotated[CodecKeys | None, Knob(flag="codec-keys")] = None
    """Encrypt every payload sent to Temporal with these keys: a folder (a mounted Secret: a file per key id holding
    its base64, and `current` naming the key that encrypts) or a YAML file {current: ID, keys: {ID: BASE64}}. Unset:
    payloads go to Temporal in clear; production should set it (README, Payload encryption)."""

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

    def codec(self) -> EncryptionCodec | None:
        """The payload codec of the configured keys; None when none are configured."""
        return EncryptionCodec(load_keys(self.codec_keys)) if self.codec_keys else None


ENCODED_FAILURE = "Encoded failure"
"""What a failure's message says in the history when the real one is encrypted (the SDK's own words)."""


class _EncodedScrubbingFailureConverter(ScrubbingFailureConverter):
    """The scrubbing failure converter, then each failure's message and stack trace moved into an encoded payload.

    In that order: what the codec encrypts is the scrubbed message, no more than a history
    without encryption would hold. The SDK's own `encode_common_attributes` would move the
    message before the scrubbing runs.
    """

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        level = failure
        while True:
            if not level.HasField("encoded_attributes"):  # a cause converted by this method is encoded already
                attributes = {"message": level.message, "stack_trace": level.stack_trace}
                level.encoded_attributes.CopyFrom(payload_converter.to_payloads([attributes])[0])
                level.message, level.stack_trace = ENCODED_FAILURE, ""
            if not level.HasField("cause"):
                return
            level = level.cause


def data_converter(codec: PayloadCodec | None = None) -> DataConverter:
    """The converter of every payload ferry sends through Temporal: pydantic models as JSON, failures scrubbed, then
    `codec`'s encoding.

    With a codec, failures move their (scrubbed) message and stack trace into an encoded
    payload too: they quote specs and errors as much as the payloads do.
    """
    if codec is None:
        return dataclasses.replace(pydantic_data_converter, failure_converter_class=ScrubbingFailureConverter)
    return dataclasses.replace(
        pydantic_data_converter, payload_codec=codec, failure_converter_class=_EncodedScrubbingFailureConverter
    )


async def connect_temporal(
    settings: TemporalSettings,
    *,
    identity: str | None = None,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """A client with ferry's data converter (encrypting with the settings' codec keys, if any); `runtime` carries
    metrics, `interceptors` tracing."""
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        tls=settings.tls(),
        data_converter=data_converter(settings.codec()),
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
    configuration.retries = request_retries()
    return BoundedApiClient(configuration, timeouts)
