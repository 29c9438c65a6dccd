"""ops_lib.py - what the ops_*.py tests share: numbered verdicts and the
exit status they add up to."""
import sys

fails = []


def check(cond, what):
    """Prints ok/FAIL what; returns cond."""
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)
    return cond


def finish():
    sys.exit(1 if fails else 0)
