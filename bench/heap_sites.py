#!/usr/bin/env python3
"""Which of Wharf's call sites hold a node's heap at its peak.

Runs `heaptrack_print` over one heaptrack file for its peak consumers, one
backtrace at a time (`-m 0`: allocation first, `main` last, each frame with
its source file's path), and charges each backtrace's bytes at the peak to
the Wharf frame nearest the allocation, shown with the frame it called (so
`write_block (payload_blocks.rs) -> insert<> (tree.rs)` is memory sled keeps
for what `write_block` inserted). A frame is Wharf's when its file is under
the workspace's `crates/wharf*/` (heaptrack prints those paths relative to
the workspace, a dependency's as `src/...` or under ~/.cargo, the standard
library's under /rustc/), so a file name we share with a dependency
(node.rs, mod.rs) is told apart. Backtraces with no Wharf frame are charged
to the frame nearest the thread's start that is not plumbing (a task's
poll, a thread's start), so openraft's and sled's own tasks and threads
show by name. Ends with heaptrack's own peak heap and peak RSS.

    bench/heap_sites.py HEAPTRACK_FILE [TOP]
"""
import collections
import os
import re
import subprocess
import sys

HEADER = re.compile(r"^([\d.]+)([KMGT]?)B? peak memory consumed over")
UNIT = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # heaptrack's are decimal
FILE = re.compile(r"^    at (.*?)(?::\d+)?$")
OURS = re.compile(r"(^|/)crates/wharf[^/]*/")
# Frames that only run something else: a task's poll, a thread's start.
PLUMBING = re.compile(
    r"harness\.rs|core\.rs|panicking\.rs|panic\.rs|unwind_safe|__rust_try|"
    r"instrument\.rs|future\.rs|unsafe_cell\.rs|thread|backtrace\.rs|boxed\.rs|"
    r"function\.rs|clone3|start_thread|blocking|task|context\.rs|scoped|runtime"
)


def short(symbol):
    """A symbol as its last two path parts, without the hash or generics."""
    symbol = re.sub(r"::h[0-9a-f]{16}$", "", symbol.split(" ")[0])
    symbol = symbol.replace("$LT$", "<").replace("$GT$", ">").replace("$u20$", " ")
    return "::".join(symbol.split("::")[-2:])


def where(path):
    """A source path as its crate (ours or a registry one's) and file name."""
    crate = re.search(r"(?:^|/)crates/(wharf[^/]*)/|/registry/src/[^/]+/([^/]+?)-\d[^/]*/", path)
    name = os.path.basename(path)
    return f"{crate.group(1) or crate.group(2)}/{name}" if crate else name


def label(frame):
    symbol, path = frame
    return f"{short(symbol)} ({where(path)})" if path else short(symbol)


def charge(frames):
    """frames: (symbol, path) from the allocation out to main."""
    for k, (_, path) in enumerate(frames):
        if path and OURS.search(path):
            callee = f" -> {label(frames[k - 1])}" if k > 0 else ""
            return label(frames[k]) + callee
    for frame in reversed(frames):
        if not PLUMBING.search(label(frame)) and not frame[0].startswith("main"):
            return "no Wharf frame: " + label(frame)
    return "no Wharf frame"


def backtraces(lines):
    """(bytes at the peak, frames) per backtrace, and the summary lines."""
    cost, frames, summary = None, [], []
    for line in lines:
        head = HEADER.match(line)
        if head:
            if cost is not None:
                yield cost, frames
            cost, frames = float(head.group(1)) * UNIT[head.group(2)], []
        elif line.startswith("  ") and not line.startswith("   ") and cost is not None:
            frames.append([line.strip(), None])
        elif (m := FILE.match(line)) and frames:
            frames[-1][1] = m.group(1)
        elif line.startswith(("peak heap", "peak RSS")):
            summary.append(line.rstrip("\n"))
    if cost is not None:
        yield cost, frames
    yield None, summary


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    out = subprocess.run(
        ["heaptrack_print", "-f", sys.argv[1], "-m", "0", "-p", "1", "-a", "0",
         "-T", "0", "-l", "0", "-n", "10000000"],
        capture_output=True, text=True, check=True,
    ).stdout
    held, total, summary = collections.Counter(), 0.0, []
    for cost, frames in backtraces(out.splitlines()):
        if cost is None:
            summary = frames
            continue
        total += cost
        held[charge([tuple(f) for f in frames])] += cost
    for line in summary:
        print(line)
    if total == 0:
        sys.exit(f"{sys.argv[1]}: no heap at the peak (a file cut short?)")
    print(f"  {total / 2**20:7.1f} MiB held at the peak")
    for site, cost in held.most_common(top):
        print(f"  {cost / 2**20:7.1f} MiB {100 * cost / total:5.1f}%  {site}")


if __name__ == "__main__":
    main()
