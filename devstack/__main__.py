"""`python -m devstack setup|up`: see devstack/cli.py."""

import sys

from devstack.cli import main

sys.exit(main())
