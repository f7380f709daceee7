#!/usr/bin/env python3
"""Starts a data-parallel group of one command on this host, as torchrun would, for the tests.

    ranks.py --nproc 2 [--world-size N] [--ranks 0,1] [--port P] [--timeout S] -- CMD ARGS...

Every started rank gets RANK, WORLD_SIZE (--world-size, default --nproc), LOCAL_RANK,
MASTER_ADDR=127.0.0.1 and MASTER_PORT (--port, default a free one). --ranks starts only those
ranks (a group that never completes). Each rank's stderr is printed prefixed 'rank R: ' after
all have ended (in rank order, so FileCheck sees a stable order), then 'rank R: exit CODE'.
Exits 0 when every rank exited 0, else 1. A rank still running after --timeout is killed.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--world-size", type=int)
    p.add_argument("--ranks")
    p.add_argument("--port", type=int)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = a.command[1:] if a.command and a.command[0] == "--" else a.command
    world = a.world_size or a.nproc
    ranks = [int(r) for r in a.ranks.split(",")] if a.ranks else list(range(a.nproc))
    port = a.port or free_port()
    procs = {}
    for r in ranks:
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        err = tempfile.TemporaryFile()
        procs[r] = (subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err), err)
    failed = False
    for r, (proc, err) in procs.items():
        try:
            code = proc.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            code = "killed after --timeout"
        err.seek(0)
        for line in err.read().decode(errors="replace").splitlines():
            print(f"rank {r}: {line}")
        print(f"rank {r}: exit {code}")
        failed = failed or code != 0
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
