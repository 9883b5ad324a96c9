"""Settings of ferry's components, declared once: each knob's type, default, limits and description.

A component's settings are one tree of frozen pydantic dataclasses (`knobs.py` says how a
field becomes a flag and a FERRY_ variable); `loading.py` fills the tree from flags and the
environment and turns a bad value into one line naming the setting; `arguments.py` makes
the argparse options, whose --help prints each field's docstring.
"""
