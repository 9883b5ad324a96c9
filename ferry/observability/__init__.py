"""Logs, traces and metrics of ferry's components: how an operator sees what ferry does."""
