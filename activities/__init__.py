"""The saga's side effects: each activity does one step or undoes it, and is safe to run again.

Activities are classes that receive their clients, so the worker wires real ones and
tests run them against the real components. Names and inputs live in ferry.api.saga.
"""
