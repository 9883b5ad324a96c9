"""The local stack: real Temporal, Kubernetes, S3 and PostgreSQL, built, started and stopped by ferry.

Used by `make up` (`python -m devstack up`) and by the tests; the product code (workflows, activities, watcher,
worker) never imports it, which import-linter checks.
"""
