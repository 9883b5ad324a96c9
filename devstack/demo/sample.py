"""The sample that `make up` migrates: an `orders` database behind a StatefulSet named orders-db.

Everything is created idempotently on the local stack: the source database with a few
tables of realistic data in the `source` PostgreSQL instance, an empty `orders` database
in the `target` instance, namespace `shop` with the orders-db StatefulSet and its
Service (Pods run on the kwok node), the Secrets the Migration names, and the bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import psycopg
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo

NAMESPACE = "shop"
MIGRATION = "orders-db-to-18"
DATABASE = "orders"
BUCKET = "ferry-snapshots"
SOURCE = "orders-db"
TARGET = "orders-db-18"

SCHEMA = """
create schema if not exists sales;
create table sales.customers (
    id bigserial primary key,
    email text not null unique,
    name text not null,
    created_at timestamptz not null default now()
);
create table sales.orders (
    id bigserial primary key,
    customer_id bigint not null references sales.customers(id),
    status text not null check (status in ('new', 'paid', 'shipped', 'cancelled')),
    total numeric(12, 2) not null,
    items jsonb not null,
    created_at timestamptz not null default now()
);
create index orders_by_customer on sales.orders (customer_id, created_at);
"""

SEED_CUSTOMERS = """
insert into sales.customers (email, name)
select 'customer' || n || '@example.com', 'Customer ' || n from generate_series(1, %(customers)s) as n
"""

SEED_ORDERS = """
insert into sales.orders (customer_id, status, total, items, created_at)
select 1 + (n %% %(customers)s),
       (array['new', 'paid', 'shipped', 'cancelled'])[1 + n %% 4],
       round((n %% 997) * 1.37 + 5, 2),
       jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (n %% 113), 'qty', 1 + n %% 5)),
       now() - make_interval(mins => n)
from generate_series(1, %(orders)s) as n
"""


@dataclasses.dataclass(frozen=True)
class Sample:
    namespace: str
    migration: str
    source: PostgresEndpoint
    target: PostgresEndpoint


def _ensure_database(admin: PostgresEndpoint, name: str) -> tuple[PostgresEndpoint, bool]:
    """Creates the database if missing; returns its endpoint and whether it was created now."""
    with psycopg.connect(admin.dsn, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'create database "{name}"')
    return dataclasses.replace(admin, database=name), not exists


def seed_databases(info: StackInfo, orders: int) -> tuple[PostgresEndpoint, PostgresEndpoint]:
    source, created = _ensure_database(info.postgres["source"], DATABASE)
    if created:
        with psycopg.connect(source.dsn) as conn:
            conn.execute(SCHEMA)
            sizes = {"customers": max(1, orders // 20), "orders": orders}
            conn.execute(SEED_CUSTOMERS, sizes)
            conn.execute(SEED_ORDERS, sizes)
    target, _ = _ensure_database(info.postgres["target"], DATABASE)
    return source, target


def _create(create: Any, *args: Any) -> None:
    try:
        create(*args)
    except ApiException as error:
        if error.status != 409:
            raise


def _connection_secret(name: str, endpoint: PostgresEndpoint) -> k8s.V1Secret:
    data = {
        "host": endpoint.host,
        "port": str(endpoint.port),
        "username": endpoint.user,
        "password": endpoint.password,
        "database": endpoint.database,
    }
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data=data)


def source_objects(replicas: int) -> tuple[k8s.V1Service, k8s.V1StatefulSet]:
    """orders-db as it runs before a migration: a postgres:15 StatefulSet on 1Gi "standard" volumes,
    behind the stable Service orders-db that its clients use."""
    labels = {"app": SOURCE}
    service = k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=SOURCE),
        spec=k8s.V1ServiceSpec(selector=labels, ports=[k8s.V1ServicePort(name="postgres", port=5432)]),
    )
    container = k8s.V1Container(
        name="postgres",
        image="postgres:15",
        ports=[k8s.V1ContainerPort(container_port=5432, name="postgres")],
        volume_mounts=[k8s.V1VolumeMount(name="data", mount_path="/var/lib/postgresql/data")],
    )
    claim = k8s.V1PersistentVolumeClaim(
        metadata=k8s.V1ObjectMeta(name="data"),
        spec=k8s.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            storage_class_name="standard",
            resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        ),
    )
    stateful_set = k8s.V1StatefulSet(
        metadata=k8s.V1ObjectMeta(name=SOURCE),
        spec=k8s.V1StatefulSetSpec(
            service_name=SOURCE,
            replicas=replicas,
            pod_management_policy="Parallel",
            selector=k8s.V1LabelSelector(match_labels=labels),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels), spec=k8s.V1PodSpec(containers=[container])
            ),
            volume_claim_templates=[claim],
        ),
    )
    return service, stateful_set


def create_workload(api: k8s.ApiClient, info: StackInfo, source: PostgresEndpoint, target: PostgresEndpoint) -> None:
    """Namespace, the orders-db StatefulSet and Service, and the Secrets; existing ones are kept."""
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    _create(core.create_namespace, k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    service, stateful_set = source_objects(replicas=1)
    _create(core.create_namespaced_service, NAMESPACE, service)
    _create(apps.create_namespaced_stateful_set, NAMESPACE, stateful_set)
    _create(core.create_namespaced_secret, NAMESPACE, _connection_secret("orders-db-source", source))
    _create(core.create_namespaced_secret, NAMESPACE, _connection_secret("orders-db-target", target))
    assert info.s3_access_key is not None
    assert info.s3_secret_key is not None
    credentials = {"accessKeyId": info.s3_access_key, "secretAccessKey": info.s3_secret_key}
    secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="snapshot-credentials"), string_data=credentials)
    _create(core.create_namespaced_secret, NAMESPACE, secret)


def create_bucket(info: StackInfo) -> None:
    s3 = info.s3_client()
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=BUCKET)


def migration_manifest(info: StackInfo, name: str = MIGRATION) -> dict[str, Any]:
    """The sample Migration: orders-db (postgres:15) to orders-db-18 (postgres:18) on the `fast` StorageClass."""
    return {
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "Migration",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": {"statefulSet": SOURCE, "service": SOURCE},
            "target": {
                "statefulSet": TARGET,
                "image": "postgres:18",
                "storageClassName": "fast",
                "storageSize": "2Gi",
            },
            "driver": {"type": "postgresql", "sourceSecret": "orders-db-source", "targetSecret": "orders-db-target"},
            "snapshot": {
                "bucket": BUCKET,
                "prefix": "shop/",
                "endpoint": info.s3_endpoint,
                "allowInsecureEndpoint": True,  # the stack's S3 is plain http, on loopback
                "region": info.s3_region,
                "credentialsSecret": "snapshot-credentials",
                "retention": {"afterSuccess": "Keep"},
            },
        },
    }


def prepare(api: k8s.ApiClient, info: StackInfo, orders: int) -> Sample:
    """Everything the sample Migration needs, created if missing."""
    source, target = seed_databases(info, orders)
    create_workload(api, info, source, target)
    create_bucket(info)
    return Sample(NAMESPACE, MIGRATION, source, target)
