"""Run one test module of the dg package with unittest and end with the line
"N passed, M failed" (what tools/test_summary.py counts). Exit status 0 when
all passed, 77 (meson's skip) when numpy is missing, else 1.

    python3 python/tests/run.py test_graph [-v]
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))       # python/, for import dg
sys.path.insert(0, HERE)

try:
    import numpy  # noqa: F401
except ImportError:
    print("skipped: this python3 (%s) has no numpy (Debian: apt-get install python3-numpy)"
          % sys.executable)
    sys.exit(77)


def main():
    names = [a for a in sys.argv[1:] if not a.startswith("-")]
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - failed - len(result.skipped)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
