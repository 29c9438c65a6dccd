#!/usr/bin/python3
"""logits_close.py - two ecs-run --dump-logits files agree within a tolerance.

  logits_close.py REF.json OTHER.json TOL

Exit 0 when both have the same positions, every logit OTHER reports for an
id REF also reports differs by at most TOL, and OTHER's top token equals
REF's at every position where REF's top two are more than TOL apart (a
closer pair is a near-tie that a difference within TOL may flip). Prints
one line: the largest difference and how many top tokens agree.
Used where bit-exactness is not possible: the GPU tier computes from f32
activations, the CPU from activations quantized to q8 (test_gpu_worker.sh,
tests/gpu/run.sh)."""
import json
import sys


def main():
    ref_path, other_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a = json.load(open(ref_path))["positions"]
    b = json.load(open(other_path))["positions"]
    if len(a) != len(b) or not a:
        print("positions: %d vs %d" % (len(a), len(b)))
        return 1
    worst, same, bad = 0.0, 0, []
    for i, (pa, pb) in enumerate(zip(a, b)):
        da = dict((t, v) for t, v in pa)
        for t, v in pb:
            if t in da:
                worst = max(worst, abs(da[t] - v))
        if pa[0][0] == pb[0][0]:
            same += 1
        elif len(pa) < 2 or pa[0][1] - pa[1][1] > tol:
            bad.append(i)
    print("largest logit difference %.4f (tolerance %g), top token equal at %d of %d positions%s"
          % (worst, tol, same, len(a),
             "; differs beyond a near-tie at %s" % bad[:8] if bad else ""))
    return 0 if worst <= tol and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
