"""A real S3 API on loopback: versitygw serving a local folder through its posix backend."""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from devstack.stack.install import Binaries

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
from devstack.stack.processes import ManagedProcess, go_environment
from devstack.stack.readiness import LOOPBACK, PortBook, wait_until

REGION = "us-east-1"


@dataclasses.dataclass
class S3Server:
    """versitygw with root credentials generated once per state folder."""

    binaries: Binaries
    folder: Path
    ports: PortBook
    logs: Path
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.port('s3')}"

    @property
    def credentials(self) -> tuple[str, str]:
        """(access key, secret key), created on first use and kept in the state folder."""
        path = self.folder / "credentials"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            path.write_text(f"ferry{secrets.token_hex(6)}\n{secrets.token_urlsafe(30)}\n")
            path.chmod(0o600)
        access, secret = path.read_text().split()
        return access, secret

    def start(self) -> ManagedProcess:
        data, versions = self.folder / "data", self.folder / "versions"
        data.mkdir(parents=True, exist_ok=True)
        versions.mkdir(parents=True, exist_ok=True)
        access, secret = self.credentials
        env = go_environment(dict(os.environ, ROOT_ACCESS_KEY=access, ROOT_SECRET_KEY=secret))
        # --versioning-dir lets a bucket keep versions once asked to (PutBucketVersioning), as on AWS; none does by
        # default, so every other bucket behaves as before.
        self.process = ManagedProcess(
            name="s3",
            argv=[
                str(self.binaries.versitygw),
                f"--port={LOOPBACK}:{self.ports.port('s3')}",
                "posix",
                f"--versioning-dir={versions}",
                str(data),
            ],
            env=env,
            log_path=self.logs / "s3.log",
        )
        self.process.start()
        return self.process

    def client(self) -> S3Client:
        access, secret = self.credentials
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def wait(self, timeout: float) -> None:
        s3 = self.client()
        wait_until(
            "S3 server (versitygw)", lambda: "Buckets" in s3.list_buckets(), timeout=timeout, process=self.process
        )
