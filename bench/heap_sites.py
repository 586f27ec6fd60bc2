#!/usr/bin/env python3
"""Which of Wharf's call sites hold a node's heap at its peak.

Reads the stacks heaptrack_print writes with `--flamegraph-cost-type peak
-F FILE` (one stack per line, root first, frames split by `;`, then the
bytes that stack held at the moment the heap peaked) and charges each
stack to the Wharf frame nearest its allocation, shown with the frame it
called (so `write_block (payload_blocks.rs) -> insert<> (tree.rs)` is
memory sled keeps for what `write_block` inserted). A frame is Wharf's when
its symbol names a `wharf_` crate or its file is one of ours, by base name,
that no dependency under ~/.cargo/registry also has. Stacks with no Wharf
frame are charged to the frame below tokio's task harness or the thread's
start, so openraft's and sled's own tasks and threads show by name.

    bench/heap_sites.py STACKS [TOP]
"""
import collections
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_names(pattern):
    return {os.path.basename(p) for p in glob.glob(pattern, recursive=True)}


OURS = base_names(f"{ROOT}/crates/*/src/**/*.rs") - base_names(
    os.path.expanduser("~/.cargo/registry/src/*/*/src/**/*.rs")
)
# A frame's symbol, then ` (file.rs)` when heaptrack knew the file.
FRAME = re.compile(r"^(.*?)(?: \(([^()]*)\))?$")
# Frames that only run something else: a task's poll, a thread's start.
PLUMBING = re.compile(
    r"harness\.rs|core\.rs|panicking\.rs|panic\.rs|unwind_safe|__rust_try|"
    r"instrument\.rs|future\.rs|unsafe_cell\.rs|thread|backtrace\.rs|boxed\.rs|"
    r"function\.rs|clone3|start_thread|blocking|task|context\.rs|scoped|runtime"
)


def short(symbol):
    """A v0-mangled (`_R...`) or legacy symbol as its last few path parts."""
    if symbol.startswith("_R"):
        parts, i = [], 0
        while i < len(symbol):
            m = re.match(r"(\d+)_?", symbol[i:])
            if not m:
                i += 1
                continue
            n, j = int(m.group(1)), i + len(m.group(0))
            name = symbol[j : j + n]
            if n and re.fullmatch(r"[A-Za-z_]\w*", name):
                parts.append(name)
                i = j + n
            else:
                i = j
        symbol = "::".join(p for p in parts if not re.fullmatch(r"Cs\w+", p))
    symbol = re.sub(r"::h[0-9a-f]{16}$", "", symbol)
    symbol = symbol.replace("$LT$", "<").replace("$GT$", ">").replace("$u20$", " ")
    return "::".join(symbol.split("::")[-2:])


def label(frame):
    symbol, file = FRAME.match(frame).groups()
    return f"{short(symbol)} ({file})" if file else short(symbol)


def is_ours(frame):
    symbol, file = FRAME.match(frame).groups()
    return "wharf_" in symbol or (file in OURS)


def charge(frames):
    for k in range(len(frames) - 1, -1, -1):
        if is_ours(frames[k]):
            callee = f" -> {label(frames[k + 1])}" if k + 1 < len(frames) else ""
            return label(frames[k]) + callee
    for frame in frames:
        if not PLUMBING.search(frame) and not frame.startswith("main"):
            return "no Wharf frame: " + label(frame)
    return "no Wharf frame"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    held, total = collections.Counter(), 0
    for line in open(sys.argv[1]):
        stack, _, cost = line.rstrip("\n").rpartition(" ")
        if not cost.isdigit():
            continue
        total += int(cost)
        held[charge(stack.rstrip(";").split(";"))] += int(cost)
    print(f"  {total / 2**20:7.1f} MiB held at the peak")
    for site, cost in held.most_common(top):
        print(f"  {cost / 2**20:7.1f} MiB {100 * cost / total:5.1f}%  {site}")


if __name__ == "__main__":
    main()
