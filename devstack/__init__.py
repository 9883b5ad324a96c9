"""Development tools, not part of ferry's product: the local stack of real components and the `make up` demo.

Nothing in ferry's packages imports this (import-linter checks it), the wheel and the
image leave it out, and its dependencies are in the dev group.
"""
