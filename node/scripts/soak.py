#!/usr/bin/env python3
"""A soak of a 3-member coordinator cluster: hours of load, sampled, to
show that nothing grows.

It starts three `leasehold serve` members (plaintext, on loopback, fsync
on), forms the cluster, sets a policy of 1 s windows, then until
`--hours` have passed:

- runs `leasehold bench` back to back, each run a new process (new client
  sessions) for `--bench-secs`, leasing across `--keys` keys (every key a
  new window each second: windows are made and collected all the time);
- every `--step-down-mins`, asks the leader to step down (a leader change);
- every `--backup-mins`, saves a backup with `snapshot save --out-dir
  --keep 3`;
- every `--sample-secs`, writes one CSV row per member: RSS, open file
  descriptors, threads, the data directory's size and file count, and the
  leases done so far.

At the end it prints, per member and measure, the mean of the second and
of the last quarter of the run (the first is the warm-up: caches, the
first segments and snapshots) and their ratio, and exits 1 when a member's
RSS, descriptors or data directory grew by more than `--max-growth` (the
last quarter's mean over the second's) or a member died.

  cargo build --release -p leasehold-node --bin leasehold
  python3 node/scripts/soak.py --hours 2 --out soak.csv
  python3 node/scripts/soak_plot.py soak.csv docs/benchmarks/soak.png   (matplotlib)
"""
import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_ports(n):
    """n free consecutive ports below the ephemeral range."""
    import random
    for _ in range(100):
        base = random.randrange(10000, 30000)
        held = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                held.append(s)
            return base
        except OSError:
            pass
        finally:
            for s in held:
                s.close()
    raise SystemExit("no free ports")


def proc_value(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def dir_size(path):
    total, files = 0, 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                pass
    return total, files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/leasehold")
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--out", default="soak.csv")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--bench-secs", type=int, default=60)
    parser.add_argument("--sample-secs", type=int, default=15)
    parser.add_argument("--step-down-mins", type=float, default=10)
    parser.add_argument("--backup-mins", type=float, default=10)
    parser.add_argument("--max-growth", type=float, default=1.25)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    work = tempfile.mkdtemp(prefix="leasehold-soak-")
    base = free_ports(3)
    addrs = [f"127.0.0.1:{base + i}" for i in range(3)]
    endpoints = ",".join(addrs)
    members = []
    for i, addr in enumerate(addrs):
        log = open(os.path.join(work, f"member-{i + 1}.log"), "w")
        members.append(subprocess.Popen(
            [binary, "serve", "--insecure", "--id", str(i + 1), "--listen", addr,
             "--data-dir", os.path.join(work, f"data-{i + 1}"), "--join-members", "1,2,3"],
            stdout=log, stderr=log))

    def cli(*more, check=True):
        return subprocess.run([binary, *more, "--insecure", "--endpoint", endpoints],
                              check=check, capture_output=True, text=True)

    subprocess.run([binary, "cluster", "init", "--insecure", "--endpoint", addrs[0], "--wait-secs", "30",
                    *[x for i, a in enumerate(addrs) for x in ("--member", f"{i + 1}={a}")]],
                   check=True, capture_output=True)
    cli("policy", "set", "--prefix", "soak/", "--limit", "1000000", "--window-ms", "1000")
    backups = os.path.join(work, "backups")
    os.makedirs(backups)
    start = time.time()
    end = start + args.hours * 3600
    leases = 0
    bench = None
    next_sample = start
    next_step_down = start + args.step_down_mins * 60
    next_backup = start + args.backup_mins * 60
    step_downs = backups_saved = bench_runs = 0
    out = open(args.out, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(["elapsed_s", "member", "rss_kib", "fds", "threads", "data_bytes", "data_files", "leases"])
    failed = ""
    try:
        while time.time() < end and not failed:
            now = time.time()
            if bench is None or bench.poll() is not None:
                if bench is not None:
                    try:
                        leases += json.loads(bench.stdout.read() or "{}").get("leases", 0)
                    except json.JSONDecodeError:
                        pass
                bench = subprocess.Popen(
                    [binary, "bench", "--insecure", "--endpoint", endpoints, "--region", "soak",
                     "--key", "soak/k", "--keys", str(args.keys), "--no-setup",
                     "--concurrency", str(args.concurrency), "--duration-secs", str(args.bench_secs),
                     "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                bench_runs += 1
            if now >= next_step_down:
                cli("cluster", "step-down", check=False)
                step_downs += 1
                next_step_down += args.step_down_mins * 60
            if now >= next_backup:
                done = cli("snapshot", "save", "--out-dir", backups, "--keep", "3", check=False)
                backups_saved += done.returncode == 0
                next_backup += args.backup_mins * 60
            if now >= next_sample:
                for i, member in enumerate(members):
                    if member.poll() is not None:
                        failed = f"member {i + 1} exited with {member.returncode}"
                        break
                    pid = member.pid
                    size, files = dir_size(os.path.join(work, f"data-{i + 1}"))
                    writer.writerow([round(now - start), i + 1, proc_value(pid, "VmRSS"),
                                     len(os.listdir(f"/proc/{pid}/fd")), proc_value(pid, "Threads"),
                                     size, files, leases])
                out.flush()
                next_sample += args.sample_secs
            time.sleep(0.5)
    finally:
        if bench is not None and bench.poll() is None:
            bench.terminate()
        for member in members:
            member.terminate()
        for member in members:
            member.wait()
        out.close()
    print(f"{bench_runs} bench runs, {leases} leases, {step_downs} step-downs, "
          f"{backups_saved} backups, {len(os.listdir(backups))} kept; data in {work}")
    rows = list(csv.DictReader(open(args.out)))
    grew = []
    for member in ("1", "2", "3"):
        mine = [r for r in rows if r["member"] == member]
        quarter = max(1, len(mine) // 4)
        for measure in ("rss_kib", "fds", "threads", "data_bytes", "data_files"):
            first = sum(float(r[measure]) for r in mine[quarter:2 * quarter]) / quarter
            last = sum(float(r[measure]) for r in mine[-quarter:]) / quarter
            ratio = last / first if first else float("nan")
            print(f"member {member} {measure:>10}: second quarter {first:14.0f}  last quarter {last:14.0f}  x{ratio:.2f}")
            if measure in ("rss_kib", "fds", "data_bytes") and first and ratio > args.max_growth:
                grew.append(f"member {member} {measure} x{ratio:.2f}")
    if failed or grew:
        print("FAIL: " + "; ".join([failed] + grew if failed else grew))
        sys.exit(1)
    print("PASS: nothing grew")


if __name__ == "__main__":
    main()
