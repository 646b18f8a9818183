"""Checks, before blocks imports them, that its sibling packages' names find this distribution's.

The check lives in offload/_siblings.py and runs by its path: importing it by name could find the shadow.
"""

import os
import runpy

_CHECK = os.path.join(os.path.dirname(__file__), os.pardir, "offload", "_siblings.py")
check_siblings = runpy.run_path(_CHECK)["check_siblings"]
check_siblings("blocks", ("modular", "components", "offload"))
