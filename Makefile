# Every target does its own setup first (idempotent, cached), so any of them works on a fresh clone.
.DEFAULT_GOAL := help
VENV := .venv/bin

.PHONY: help setup up test unit check test-only generate rbac format

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: ## install the Python dependencies and find or build the stack's components
	@bash scripts/setup.sh

up: setup ## the main job: the local stack, ferry's worker and watcher, a sample migration followed live; then stops (ARGS=--keep-running stays up until Ctrl-C)
	$(VENV)/python -m devstack up $(ARGS)

test: ## the test command: setup (with headless Chromium and helm), static checks, then every test against a real local stack
	@bash scripts/setup.sh --browser --helm
	$(MAKE) --no-print-directory check
	$(VENV)/pytest

unit: setup ## the tests that need no stack (settings, deployment files), in seconds
	$(VENV)/pytest -m unit

check: ## ruff (lint and format), mypy --strict and import-linter
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/mypy
	$(VENV)/lint-imports

test-only: ## run pytest without setup or checks (pass ARGS="-k name")
	$(VENV)/pytest $(ARGS)

generate: setup ## regenerate deploy/crd from the API models
	$(VENV)/ferry crd -o deploy/crd/migrations.ferry.dev.yaml

rbac: setup ## regenerate deploy/rbac/worker_secrets.yaml: where the worker reads Secrets (SECRET_NAMESPACES=shop,billing)
	$(VENV)/ferry rbac --secret-namespaces "$(SECRET_NAMESPACES)" -o deploy/rbac/worker_secrets.yaml

format: ## apply ruff's fixes and formatting
	$(VENV)/ruff check --fix .
	$(VENV)/ruff format .
