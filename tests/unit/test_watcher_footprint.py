"""What the watcher loads: only the parts of the generated Kubernetes client it calls (issue #17)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_watchers_kubernetes_calls_do_not_load_the_generated_core_api() -> None:
    """The core/v1 API module builds validators for every core model: 85 MiB, more than the watcher holds for ten
    thousand Migrations, for the one Event call it makes. A fresh interpreter, so that nothing else loaded it."""
    code = (
        "import sys; from kubernetes import client; from watcher.kube import Kube; "
        "Kube(client.ApiClient(), 'x'); print('kubernetes.client.api.core_v1_api' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
