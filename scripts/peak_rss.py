#!/usr/bin/env python3
"""Peak memory of a command, split into the process's own and its mapped files (issue 39's checkpoint figures).

  scripts/peak_rss.py [--drop-page-cache DIR] OUT.json CMD...

Runs CMD, samples /proc/PID/status every 0.1 s and writes the peaks of VmHWM, VmRSS, RssAnon (the process's own) and
RssFile (mapped files: a checkpoint's pages) in MiB, with the exit code and wall time, to OUT.json (and stdout's last
line). --drop-page-cache DIR first evicts DIR's files from the page cache (fsync, posix_fadvise DONTNEED): a cold load.
"""
import json
import os
import subprocess
import sys
import time


def drop_page_cache(directory):
    for name in sorted(os.listdir(directory)):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(argv):
    if len(argv) >= 2 and argv[0] == "--drop-page-cache":
        drop_page_cache(argv[1])
        argv = argv[2:]
    if len(argv) < 2:
        sys.exit("usage: scripts/peak_rss.py [--drop-page-cache DIR] OUT.json CMD...")
    out, cmd = argv[0], argv[1:]
    t0 = time.time()
    proc = subprocess.Popen(cmd)
    peak = {"VmHWM": 0, "VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peak:
                        peak[key] = max(peak[key], int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.1)
    result = {k + "_MiB": round(v / 1024, 1) for k, v in peak.items()}
    result.update(rc=proc.returncode, wall_s=round(time.time() - t0, 2), cmd=" ".join(cmd))
    with open(out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
