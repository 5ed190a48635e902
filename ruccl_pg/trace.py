"""python -m ruccl_pg.trace DIR — what the ranks of a ruccl job were doing, from their
flight recorders (``ruccl_trace_rank_<rank>.json``, written to RUCCL_TRACE_DIR on an
error, an abort, SIGUSR1 or ``ruccl_pg.dump_trace()``).

For each process group it says, in a few lines:
  - the last collective (sequence number) every rank completed;
  - the first one where the ranks part, and how: another kind, dtype, shape, op or root,
    or a rank that never called it;
  - the errors the ranks got, and the calls still queued or running when they dumped;
  - the culprit: the rank that called something else than the others, else a rank that
    left no trace (killed, or frozen and not asked for one), else a rank that never
    called what the others wait in.

Exit status: 0 when every rank of every group agrees and nothing failed, 1 when
something is wrong (the report says what), 2 when DIR holds no trace.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections import Counter, defaultdict

FILE_RE = re.compile(r"ruccl_trace_rank_(\d+)\.json$")


def load(directory):
    """{process rank: dump} of every trace file in directory."""
    dumps = {}
    for path in sorted(glob.glob(os.path.join(directory, "ruccl_trace_rank_*.json"))):
        m = FILE_RE.search(path)
        if not m:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            dumps[int(m.group(1))] = json.load(f)
    return dumps


def _describe(e):
    s = e["kind"]
    if e.get("dtype"):
        s += f" {e['dtype']}{list(e['shape']) if e.get('shape') is not None else ''}"
    if e.get("op"):
        s += f" {e['op']}"
    if e.get("root", -1) >= 0:
        s += f" root {e['root']}"
    return s


def _signature(e):
    # all-to-all's shapes may differ between ranks (uneven splits): its dtype must not
    shape = None if e["kind"].startswith("all_to_all") or e.get("shape") is None else tuple(e["shape"])
    return (e["kind"], e.get("dtype"), shape, e.get("op"), e.get("root", -1))


def _ranks(rs):
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def analyse_group(name, size, per_rank, dumped_ns):
    """per_rank: {group rank: [entries of this group]}.  Returns (lines, culprits, ok)."""
    lines, culprits = [], []
    present = sorted(per_rank)
    missing = [r for r in range(size) if r not in per_rank]
    coll = {r: {e["seq"]: e for e in per_rank[r] if not e["p2p"]} for r in present}

    def last_done(r):
        done = [s for s, e in coll[r].items() if e["state"] == "done"]
        return f"#{max(done)}" if done else "none"

    lines.append(f'group "{name}" (size {size}): traces from {_ranks(present)}'
                 + (f"; none from {_ranks(missing)}" if missing else ""))
    if present:
        lines.append("  last completed collective: " + ", ".join(f"rank {r} {last_done(r)}" for r in present))

    # the first sequence number where the ranks part
    first_diff, never_callers = None, []
    issued = {r: max(coll[r]) if coll[r] else -1 for r in present}
    oldest = {r: min(coll[r]) if coll[r] else 0 for r in present}
    top = max(issued.values()) if issued else -1
    for seq in range(0, top + 1):
        have = {r: coll[r][seq] for r in present if seq in coll[r]}
        # ranks whose ring still covers seq (a rank with no collective of this group in
        # its ring, all pushed out by other groups' calls, says nothing)
        known = [r for r in present if coll[r] and seq >= oldest[r]]
        never = [r for r in known if r not in have and issued[r] < seq]
        sigs = Counter(_signature(e) for e in have.values())
        if len(sigs) > 1:
            common, n_common = sigs.most_common(1)[0]
            odd = sorted(r for r, e in have.items() if _signature(e) != common)
            tie = n_common * 2 <= len(have)
            majority = sorted(r for r in have if r not in odd)
            detail = "; ".join(f"{_ranks([r])} called {_describe(have[r])}" for r in odd)
            lines.append(f"  first difference: collective #{seq}: {detail}; {_ranks(majority)} called "
                         f"{_describe(have[majority[0]])}")
            culprits = odd if not tie else sorted(have)
            first_diff = seq
            break
        if never and have:
            lines.append(f"  first difference: collective #{seq} ({_describe(next(iter(have.values())))}): "
                         f"{_ranks(never)} never called it (last: "
                         + ", ".join(f"#{issued[r]} {_describe(coll[r][issued[r]])}" if issued[r] >= 0 else "none"
                                     for r in never) + ")")
            first_diff, never_callers = seq, never
            break

    # errors, and calls still in flight at dump time
    errors = defaultdict(list)
    for r in present:
        for e in per_rank[r]:
            if e["state"] == "error":
                errors[(e["seq"], e["p2p"], e["kind"], e["error"].split(":")[0])].append((r, e["error"]))
    for (seq, is_p2p, kind, code), who in sorted(errors.items())[:4]:
        what = f"{'p2p' if is_p2p else 'collective'} #{seq} {kind}"
        lines.append(f"  error: {_ranks([r for r, _ in who])} at {what}: {who[0][1]}")
    if len(errors) > 4:
        lines.append(f"  ... and {len(errors) - 4} more failed calls")
    stuck = False
    for r in present:
        pending = [e for e in per_rank[r] if e["state"] in ("queued", "running")]
        stuck |= bool(pending)
        if pending:
            e = pending[0]
            since = (dumped_ns[r] - (e["started_ns"] or e["issued_ns"])) / 1e9
            more = f" (and {len(pending) - 1} more after it)" if len(pending) > 1 else ""
            lines.append(f"  stuck: rank {r} in {'p2p' if e['p2p'] else 'collective'} #{e['seq']} {_describe(e)}, "
                         f"{e['state']} for {since:.1f} s when it dumped{more}")

    if not culprits:
        if missing:
            culprits = missing
            why = "left no trace: killed, or frozen and never asked for one (SIGUSR1)"
        elif first_diff is not None:
            culprits = never_callers
            why = f"never called collective #{first_diff}, which the others wait in or failed in"
        else:
            why = ""
        if culprits:
            lines.append(f"  culprit: {_ranks(culprits)} {why}")
    else:
        lines.append(f"  culprit: {_ranks(culprits)} (called something else than the others at #{first_diff})")
    ok = not culprits and not errors and first_diff is None and not missing and not stuck
    return lines, culprits, ok


def analyse(dumps):
    """Returns (lines, {group name: culprits}, ok) for a {process rank: dump} mapping."""
    groups = {}  # name -> size
    per_group = defaultdict(dict)  # name -> {group rank: entries}
    dumped = defaultdict(dict)
    for prank, d in sorted(dumps.items()):
        seen = Counter()
        for index, g in enumerate(d["groups"]):
            # a name made again (the world group after destroy and init) is another group
            seen[g["name"]] += 1
            name = g["name"] if seen[g["name"]] == 1 else f"{g['name']} (#{seen[g['name']]})"
            groups.setdefault(name, g["size"])
            per_group[name][g["rank"]] = [e for e in d["entries"] if e["group"] == index]
            dumped[name][g["rank"]] = d["dumped_ns"]
    lines = [f"ruccl trace: {len(dumps)} files (process ranks {', '.join(map(str, sorted(dumps)))})"]
    culprits, all_ok = {}, True
    # the biggest group (the world) first, then the others that have something to say
    for name in sorted(groups, key=lambda n: (-groups[n], n)):
        g_lines, g_culprits, ok = analyse_group(name, groups[name], per_group[name], dumped[name])
        all_ok &= ok
        if not ok or groups[name] == max(groups.values()):
            lines += g_lines
        if g_culprits:
            culprits[name] = g_culprits
    if all_ok:
        lines.append("every rank agrees, and nothing failed")
    return lines, culprits, all_ok


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ruccl_pg.trace", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the directory of the ranks' ruccl_trace_rank_<rank>.json files (RUCCL_TRACE_DIR)")
    p.add_argument("--json", action="store_true", help="print the culprits as JSON after the report")
    args = p.parse_args(argv)
    dumps = load(args.dir)
    if not dumps:
        print(f"ruccl trace: no ruccl_trace_rank_*.json in {args.dir}", file=sys.stderr)
        return 2
    lines, culprits, ok = analyse(dumps)
    print("\n".join(lines))
    if args.json:
        print(json.dumps({"culprits": culprits, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
