"""What the tests of scripts/validate's step recorders share: the scripts on the import path,
and a test case that skips, saying why, where the recorders cannot be imported (they need torch
and transformers). Imported by test_no_cache.py and test_target_law.py."""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "validate"))


class NeedsRecorders(unittest.TestCase):
    """Skipped where scripts/validate/step_programs.py does not import."""

    def setUp(self):
        try:
            import step_programs  # noqa: F401  (torch and transformers)
        except ImportError as e:
            self.skipTest(f"the recorders need torch: {e}")
