#!/usr/bin/env python3
"""How long one small write + fdatasync takes on this disk, appending to a
file (each sync also commits the new size) or overwriting blocks written
earlier (each sync writes data only). The journal's preallocation rests on
this difference.

    python3 bench/fsync_probe.py [--direct] [DIR] [PARALLEL]

With --direct it compares overwriting through the page cache with the
journal's direct writes instead: O_DIRECT, whole aligned 4 KiB blocks from
the start of the block the previous write ended in (so each 400-byte write
is one block, sometimes two), then fdatasync.

PARALLEL writers (default 1, and 3 as the three nodes of a cluster) run at
once, each on its own file in DIR (default: the current directory). Every
file is removed at the end.
"""
import mmap
import multiprocessing
import os
import sys
import time

SYNCS = 3000
WRITE_BYTES = 400
BLOCK = 4096


def writer(path, mode, out):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if mode in ("overwrite", "direct"):
        os.write(fd, b"\0" * (SYNCS * WRITE_BYTES + 2 * BLOCK))
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    if mode == "direct":
        os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    buf = b"x" * WRITE_BYTES
    # Anonymous maps start on a page: the alignment O_DIRECT wants.
    blocks = mmap.mmap(-1, 2 * BLOCK)
    blocks.write(b"x" * 2 * BLOCK)
    pos = 0
    lat = []
    for _ in range(SYNCS):
        t = time.perf_counter()
        if mode == "direct":
            start = pos // BLOCK * BLOCK
            end = -(-(pos + WRITE_BYTES) // BLOCK) * BLOCK
            os.pwrite(fd, memoryview(blocks)[: end - start], start)
            pos += WRITE_BYTES
        else:
            os.write(fd, buf)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    os.remove(path)
    lat.sort()
    out.put((lat[SYNCS // 2], lat[int(SYNCS * 0.99)], sum(lat) / SYNCS))


def main():
    args = sys.argv[1:]
    direct = "--direct" in args
    args = [a for a in args if a != "--direct"]
    directory = args[0] if len(args) > 0 else "."
    parallel = int(args[1]) if len(args) > 1 else 1
    other = "direct" if direct else "append"
    for mode in [other, "overwrite", other, "overwrite"]:
        out = multiprocessing.Queue()
        procs = [
            multiprocessing.Process(
                target=writer,
                args=(os.path.join(directory, f"fsync-probe-{i}.bin"), mode, out),
            )
            for i in range(parallel)
        ]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        for p50, p99, mean in results:
            print(
                f"{mode:9s} x{parallel}  p50 {p50 * 1e6:5.0f} us  p99 {p99 * 1e6:5.0f} us  mean {mean * 1e6:5.0f} us"
            )


if __name__ == "__main__":
    main()
