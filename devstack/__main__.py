"""`python -m devstack setup|up`: see devstack/cli.py. It ends without the interpreter's teardown (ferry/process.py)."""

from devstack.cli import main
from ferry.process import exit_without_teardown

exit_without_teardown(main())
