#!/usr/bin/python3
"""compare_logits.py - compare ecs-run's teacher-forced logits with a
reference engine's (llama.cpp / ik_llama.cpp JSON in shared/reference).

The reference holds, per prompt, the prompt ids, 32 greedy ids and the top-5
[id, logit] after prompt + generated[:i]. Feeding prompt + generated[:31]
to ecs-run gives our logits at the same positions.

  compare_logits.py args REF.json NAME
      print two lines: the comma-separated token ids to evaluate, and the
      comma-separated ids whose logits the check needs (--logits-of)
  compare_logits.py check REF.json NAME DUMP.json [--max 0.05] [--mean 0.015]
                      [--margin 0.1]
      exit 1 unless, at every step, our logit at each reference top-5 id is
      within --max of the reference, the mean abs diff is <= --mean, and our
      argmax equals theirs wherever their top1-top2 margin exceeds --margin
"""
import json
import sys


def load_result(ref_path, name):
    with open(ref_path) as f:
        ref = json.load(f)
    for r in ref["results"]:
        if r["name"] == name:
            return r
    raise SystemExit("FAIL: %s has no prompt named %s" % (ref_path, name))


def tokens_of(r):
    return r["prompt_ids"] + r["generated_ids"][: len(r["top5_logits_per_step"]) - 1]


def needed_ids(r):
    return sorted({tid for step in r["top5_logits_per_step"] for tid, _ in step})


def cmd_args(ref_path, name):
    r = load_result(ref_path, name)
    print(",".join(str(t) for t in tokens_of(r)))
    print(",".join(str(t) for t in needed_ids(r)))


def cmd_check(ref_path, name, dump_path, max_tol, mean_tol, margin):
    r = load_result(ref_path, name)
    with open(dump_path) as f:
        dump = json.load(f)
    toks = tokens_of(r)
    if dump.get("tokens") != toks:
        raise SystemExit("FAIL %s: the dump evaluated other tokens than asked" % name)
    positions = dump["positions"]
    lo = dump.get("logits_of")
    if len(positions) != len(toks) or not lo or len(lo["values"]) != len(toks):
        raise SystemExit("FAIL %s: the dump has %d positions for %d tokens"
                         % (name, len(positions), len(toks)))
    col = {tid: j for j, tid in enumerate(lo["ids"])}
    n_prompt = len(r["prompt_ids"])
    diffs, worst, bad_argmax, checked = [], (0.0, -1, -1), [], 0
    for step, top in enumerate(r["top5_logits_per_step"]):
        pos = n_prompt - 1 + step
        ours = lo["values"][pos]
        for tid, v in top:
            if tid not in col:
                raise SystemExit("FAIL %s: id %d missing from the dump" % (name, tid))
            d = abs(ours[col[tid]] - v)
            diffs.append(d)
            if d > worst[0]:
                worst = (d, step, tid)
        if r["top1_top2_logit_margin_per_step"][step] > margin:
            checked += 1
            our_top = positions[pos][0][0]
            if our_top != top[0][0]:
                bad_argmax.append((step, our_top, top[0][0]))
    mx, mean = max(diffs), sum(diffs) / len(diffs)
    print("%-18s steps %2d  max |diff| %.4f (step %d id %d)  mean %.4f  argmax checked %d, "
          "mismatches %d" % (name, len(r["top5_logits_per_step"]), mx, worst[1], worst[2], mean,
                             checked, len(bad_argmax)))
    ok = True
    if mx > max_tol:
        print("FAIL %s: max |diff| %.4f > %.4f" % (name, mx, max_tol))
        ok = False
    if mean > mean_tol:
        print("FAIL %s: mean |diff| %.4f > %.4f" % (name, mean, mean_tol))
        ok = False
    for step, ours, theirs in bad_argmax:
        print("FAIL %s: step %d argmax %d, reference %d (margin %.3f)"
              % (name, step, ours, theirs, r["top1_top2_logit_margin_per_step"][step]))
        ok = False
    return 0 if ok else 1


def opt(argv, flag, default):
    if flag in argv:
        i = argv.index(flag)
        return float(argv[i + 1])
    return default


def main(argv):
    if len(argv) >= 4 and argv[1] == "args":
        cmd_args(argv[2], argv[3])
        return 0
    if len(argv) >= 5 and argv[1] == "check":
        return cmd_check(argv[2], argv[3], argv[4], opt(argv, "--max", 0.05),
                         opt(argv, "--mean", 0.015), opt(argv, "--margin", 0.1))
    if len(argv) == 3 and argv[1] == "names":
        with open(argv[2]) as f:
            print("\n".join(r["name"] for r in json.load(f)["results"]))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
