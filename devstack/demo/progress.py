"""Live progress of the sample Migration in the terminal: the product's step table (ferry/kubectl/progress.py).

`make up` shows the same table as `kubectl ferry status -w`, so it is the product's code;
this module keeps the demo's name for it.
"""

from __future__ import annotations

from ferry.kubectl.progress import BAR_WIDTH, STATE_MARKS, Display, bar, detail

__all__ = ["BAR_WIDTH", "STATE_MARKS", "Display", "bar", "detail"]
