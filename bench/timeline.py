#!/usr/bin/env python3
"""Where one sync publish's time goes, from the nodes' timeline files.

    bench/timeline.py DIR     # DIR holds t.<pid> files from bench/timeline.sh

Reads the lines `<unix ns> <point> <key>` that a `--features timeline` build
writes (crates/wharf-raft/src/timeline.rs). The node whose file has
`svc_recv` lines is the stream's leader. With one publish in flight at a
time (`--pub 1`), each `svc_recv` opens a window that the next one closes;
in it the script finds the publish's Raft index (the leader's
`append_submit`) and then each point as the first occurrence after the point
it follows (or, for points keyed by index, the one with that index). The
followers are named by which answered first in that window: the first one
is the one the commit waited for. It prints, per point, the median and p90
offset from `svc_recv` in microseconds, and the median of each step; then
each step's p50 and p99, and its p50 among the slowest 2% of publishes (by
the leader's receive to reply), to show which steps make the tail.
Windows missing a point (the first and last, a flush that covered two
publishes' answers) are left out and counted.
"""
import bisect
import collections
import glob
import os
import statistics
import sys


def load(path):
    events = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit():
                events.append((int(parts[0]), parts[1], int(parts[2])))
    events.sort()
    return events


def first(events, point, after, before, key=None):
    """Time of the first `point` in (after, before), with `key` if given."""
    for t, p, k in events:
        if t <= after:
            continue
        if t >= before:
            return None
        if p == point and (key is None or k == key):
            return t
    return None


def window(events, lo, hi):
    """The events with lo <= t < hi (events sorted by time)."""
    a = bisect.bisect_left(events, (lo, "", -1))
    b = bisect.bisect_left(events, (hi, "", -1))
    return events[a:b]


def leader_points(ev, start, end):
    out = {"svc_recv": start}
    out["write_start"] = first(ev, "write_start", start - 1, end)
    if out["write_start"] is None:
        return None, None
    out["append_start"] = first(ev, "append_start", out["write_start"], end)
    if out["append_start"] is None:
        return None, None
    sub = next(((t, k) for t, p, k in ev if p == "append_submit" and t > out["append_start"]), None)
    if sub is None or sub[0] >= end:
        return None, None
    out["append_submit"], index = sub
    out["send"] = first(ev, "send", out["append_start"], end, key=index)
    out["sync_start"] = first(ev, "sync_start", out["append_submit"], end)
    out["sync_end"] = first(ev, "sync_end", out["sync_start"] or end, end)
    out["answer"] = first(ev, "answer", out["send"] or end, end)
    out["apply"] = first(ev, "apply", start, end, key=index)
    out["write_done"] = first(ev, "write_done", start, end, key=index)
    out["svc_reply"] = first(ev, "svc_reply", out["write_done"] or end, end)
    return out, index


def follower_points(ev, start, end, index):
    out = {"f_recv": first(ev, "f_recv", start, end, key=index)}
    if out["f_recv"] is None:
        return None
    out["append_start"] = first(ev, "append_start", out["f_recv"], end)
    out["append_submit"] = first(ev, "append_submit", out["append_start"] or end, end)
    out["sync_start"] = first(ev, "sync_start", out["append_submit"] or end, end)
    out["sync_end"] = first(ev, "sync_end", out["sync_start"] or end, end)
    out["f_answer"] = first(ev, "f_answer", out["sync_end"] or end, end)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench/timeline.py DIR")
    files = sorted(glob.glob(os.path.join(sys.argv[1], "t.*")))
    nodes = {f: load(f) for f in files}
    leaders = [f for f, ev in nodes.items() if any(p == "svc_recv" for _, p, _ in ev)]
    if len(leaders) != 1:
        sys.exit(f"expected one file with svc_recv lines, found {len(leaders)}")
    leader = nodes[leaders[0]]
    followers = [ev for f, ev in nodes.items() if f != leaders[0]]
    starts = [t for t, p, _ in leader if p == "svc_recv"]
    offsets = collections.defaultdict(list)
    cycles, skipped = [], 0
    publishes = []  # per complete publish: {(node, point): us from svc_recv}, and its cycle
    for lo, hi in zip(starts, starts[1:]):
        lev = window(leader, lo, hi)
        lp, index = leader_points(lev, lo, hi)
        fps = [follower_points(window(ev, lo, hi), lo, hi, index) for ev in followers] if lp else []
        rows = {}
        if lp and len(fps) == 2 and all(fp for fp in fps):
            fps.sort(key=lambda fp: fp["f_answer"] or hi)
            rows = {("leader", k): v for k, v in lp.items()}
            for name, fp in zip(("first follower", "second follower"), fps):
                rows.update({(name, k): v for k, v in fp.items()})
        needed = [k for k in rows if k[0] != "second follower"]
        if not rows or any(rows[k] is None for k in needed):
            skipped += 1
            continue
        one = {}
        for k, v in rows.items():
            if v is not None:
                offsets[k].append((v - lo) / 1000)
                one[k] = (v - lo) / 1000
        # When the entry could commit: the leader's sync and the first
        # follower's answer both done (one clock: every node is on this machine).
        if ("leader", "sync_end") in one and ("first follower", "f_answer") in one:
            one[("leader", "ready")] = max(one[("leader", "sync_end")], one[("first follower", "f_answer")])
        cycles.append((hi - lo) / 1000)
        publishes.append((one, (hi - lo) / 1000))
    if not cycles:
        sys.exit("no complete publish in the files")
    print(f"publishes: {len(cycles)} complete, {skipped} left out")
    print(f"publish to next publish (us): median {statistics.median(cycles):.0f}")
    print()
    served = sorted(publishes, key=lambda pc: pc[0].get(("leader", "svc_reply"), 0))
    tail = served[-max(1, len(served) * TAIL_PERCENT // 100):]
    print(f"{'node':<16} {'point':<14} {'p50 us':>8} {'p90 us':>8} {'p50 of the slowest ' + str(TAIL_PERCENT) + '%':>22}"
          "  (from the leader's svc_recv)")
    rows = sorted(offsets.items(), key=lambda kv: statistics.median(kv[1]))
    for (node, point), v in rows:
        q = statistics.quantiles(v, n=10) if len(v) > 1 else [v[0]] * 9
        t = [one[(node, point)] for one, _ in tail if (node, point) in one]
        shown = f"{statistics.median(t):>22.0f}" if t else f"{'-':>22}"
        print(f"{node:<16} {point:<14} {statistics.median(v):>8.0f} {q[8]:>8.0f} {shown}")
    print()
    print("steps (us; each publish's difference between two points):")
    steps = [
        ("leader: handler to client_write", ("leader", "svc_recv"), ("leader", "write_start")),
        ("leader: client_write to log append", ("leader", "write_start"), ("leader", "append_start")),
        ("leader: append to its fdatasync start", ("leader", "append_submit"), ("leader", "sync_start")),
        ("leader: fdatasync", ("leader", "sync_start"), ("leader", "sync_end")),
        ("leader: append to send to a follower", ("leader", "append_start"), ("leader", "send")),
        ("send to the follower's decode", ("leader", "send"), ("first follower", "f_recv")),
        ("follower: decode to log append", ("first follower", "f_recv"), ("first follower", "append_start")),
        ("follower: append to fdatasync start", ("first follower", "append_submit"), ("first follower", "sync_start")),
        ("follower: fdatasync", ("first follower", "sync_start"), ("first follower", "sync_end")),
        ("follower: fdatasync to answer", ("first follower", "sync_end"), ("first follower", "f_answer")),
        ("follower answer to leader reads it", ("first follower", "f_answer"), ("leader", "answer")),
        ("leader: answer to apply", ("leader", "answer"), ("leader", "apply")),
        ("leader synced and first answer sent, to apply", ("leader", "ready"), ("leader", "apply")),
        ("leader: apply to client_write returns", ("leader", "apply"), ("leader", "write_done")),
        ("leader: client_write returns to reply", ("leader", "write_done"), ("leader", "svc_reply")),
        ("reply to the client's next publish", ("leader", "svc_reply"), None),
    ]
    # The slowest publishes by the leader's own time from receiving one to
    # answering it (`tail`, above): which steps make the tail.
    print(f"  {'':<48} {'p50':>6} {'p99':>6} {'p50 of the slowest ' + str(TAIL_PERCENT) + '%':>22}")
    for name, a, b in steps:
        cols = []
        for group, q in ((publishes, 50), (publishes, 99), (tail, 50)):
            d = [(one[b] if b else cycle) - one[a] for one, cycle in group
                 if a in one and (b is None or b in one)]
            cols.append(f"{percentile(d, q):>6.0f}" if d else "     -")
        print(f"  {name:<48} {cols[0]} {cols[1]} {cols[2]:>22}")
    # The commit's path cut into segments that add up to the leader's
    # receive-to-reply: where the slowest publishes' extra time went.
    path = [("leader", "svc_recv"), ("leader", "send"), ("first follower", "f_recv"),
            ("first follower", "sync_start"), ("first follower", "sync_end"),
            ("first follower", "f_answer"), ("leader", "ready"), ("leader", "apply"),
            ("leader", "svc_reply")]
    whole = [one for one, _ in publishes if all(k in one for k in path)]
    slow = [one for one, _ in tail if all(k in one for k in path)]
    if whole and slow:
        print(f"\nalong the commit's path, mean us (all {len(whole)}, the slowest {len(slow)}):")
        for a, b in zip(path, path[1:]):
            m_all = statistics.mean(one[b] - one[a] for one in whole)
            m_slow = statistics.mean(one[b] - one[a] for one in slow)
            name = f"{a[0]} {a[1]} to {b[0]} {b[1]}"
            print(f"  {name:<56} {m_all:>6.0f} {m_slow:>6.0f}  +{m_slow - m_all:.0f}")
    total = [one[("leader", "svc_reply")] for one, _ in tail]
    print(f"\nthe slowest {TAIL_PERCENT}%: {len(tail)} publishes, the leader's receive to reply "
          f"{min(total):.0f}-{max(total):.0f} us")


# Share of publishes, slowest by the leader's receive-to-reply, shown apart.
TAIL_PERCENT = 2


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q / 100))]


if __name__ == "__main__":
    main()
