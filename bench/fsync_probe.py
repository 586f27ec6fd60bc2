#!/usr/bin/env python3
"""How long one small write + fdatasync takes on this disk, appending to a
file (each sync also commits the new size) or overwriting blocks written
earlier (each sync writes data only). The journal's preallocation rests on
this difference.

    python3 bench/fsync_probe.py [DIR] [PARALLEL]

PARALLEL writers (default 1, and 3 as the three nodes of a cluster) run at
once, each on its own file in DIR (default: the current directory). Every
file is removed at the end.
"""
import multiprocessing
import os
import sys
import time

SYNCS = 3000
WRITE_BYTES = 400


def writer(path, mode, out):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if mode == "overwrite":
        os.write(fd, b"\0" * (SYNCS * WRITE_BYTES + 4096))
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    buf = b"x" * WRITE_BYTES
    lat = []
    for _ in range(SYNCS):
        t = time.perf_counter()
        os.write(fd, buf)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    os.remove(path)
    lat.sort()
    out.put((lat[SYNCS // 2], lat[int(SYNCS * 0.99)], sum(lat) / SYNCS))


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    parallel = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for mode in ["append", "overwrite", "append", "overwrite"]:
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
