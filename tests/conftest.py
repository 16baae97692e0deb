"""Cross-package tests: helpers such as reference_llama import by module name."""
from __future__ import annotations

import sys
from pathlib import Path

# Tests here import helpers such as reference_llama by module name; keep that working under
# pytest's importlib import mode too, which does not put this folder on sys.path.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
