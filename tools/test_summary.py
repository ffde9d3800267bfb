#!/usr/bin/env python3
"""Sum the results of one or more meson test logs (meson-logs/testlog.json).

Criterion suites report per-test counts in their "Synthesis" line; dg's shell
integration tests and each fuzz target's run (test/fuzz/run.sh: one result per
target) end with "N passed, M failed"; any other test counts as one.
Each sanitizer report in a test's output counts as one more failure.
Prints one line per log and, last, the total "N passed, M failed". Exits 1 when
anything failed or a log is missing."""
import json
import re
import sys

SYNTH = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
PLAIN = re.compile(r"^(\d+) passed, (\d+) failed\s*$", re.M)
# Sanitizer reports fail a test even when the runner's exit status hides them
# (Criterion's workers report leaks at exit without failing the test).
SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error: ")


def count(entry):
    """(passed, failed, skipped) for one meson test entry."""
    out = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
    result = entry.get("result", "")
    if result == "SKIP":
        return 0, 0, 1
    ok = result in ("OK", "EXPECTEDFAIL")
    sanitizer = len(SANITIZER.findall(out))
    m = SYNTH.findall(out)
    if m:
        _tested, passing, failing, crashing = map(int, m[-1])
        failed = failing + crashing
        if not ok and failed == 0:
            failed = 1  # the runner itself failed (timeout, sanitizer abort at exit)
        return max(passing - sanitizer, 0), failed + sanitizer, 0
    m = PLAIN.findall(out)
    if m:
        passed, failed = map(int, m[-1])
        if not ok and failed == 0:
            failed = 1
        return max(passed - sanitizer, 0), failed + sanitizer, 0
    return (1, 0, 0) if ok and not sanitizer else (0, 1 + sanitizer, 0)


def main(paths):
    total_p = total_f = 0
    bad = False
    for path in paths:
        p = f = s = 0
        failed_names = []
        try:
            with open(path) as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    e = json.loads(line)
                    a, b, c = count(e)
                    p, f, s = p + a, f + b, s + c
                    if b:
                        failed_names.append(e.get("name", "?"))
        except OSError as exc:
            print(f"{path}: cannot read ({exc})")
            bad = True
            continue
        extra = f"; failed in: {', '.join(failed_names)}" if failed_names else ""
        print(f"{path}: {p} passed, {f} failed, {s} skipped{extra}")
        total_p, total_f = total_p + p, total_f + f
    print(f"{total_p} passed, {total_f} failed")
    return 1 if (total_f or bad) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
