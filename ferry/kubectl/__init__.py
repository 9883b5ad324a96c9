"""`kubectl ferry`: a kubectl plugin (the console script `kubectl-ferry`) to follow and steer Migrations.

It reads what a person would read (the Migration's status, its Events, the workflow's
history in Temporal, the worker's log) and steers through the same annotations the
watcher already turns into updates of the saga, so nothing here is a second way in.
"""
