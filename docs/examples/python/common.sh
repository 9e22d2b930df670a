# Shared by run.sh and run-rls.sh (sourced, not run): the checks of what
# they need, a work directory removed on exit (with the `leasehold dev`
# cluster stopped), `fail`, the virtual environment with the pinned
# packages, and free ports.
#
# The caller sets `here` (this directory), `binary` (the leasehold binary)
# and `label` (what FAIL lines name) before sourcing it; it defines `work`,
# `cluster_pid` (set it once the cluster runs), `fail`, `make_venv` (sets
# `py`) and `free_ports N`.

[ -x "$binary" ] || { echo "FAIL: no leasehold binary at $binary (cargo build -p leasehold-node first)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "FAIL: python3 is required" >&2; exit 2; }
python3 -c 'import venv, ensurepip' 2>/dev/null \
  || { echo "FAIL: python3 cannot make virtual environments (install python3-venv)" >&2; exit 2; }

work="$(mktemp -d)"
cluster_pid=""
cleanup() {
  if [ -n "$cluster_pid" ]; then
    kill "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $label: $*" >&2
  if [ -f "$work/cluster.log" ]; then
    echo "--- leasehold dev log (last 40 lines)" >&2
    tail -n 40 "$work/cluster.log" >&2
  fi
  exit 1
}

# A virtual environment in the work directory with requirements.txt; sets `py`.
make_venv() {
  python3 -m venv "$work/venv"
  py="$work/venv/bin/python"
  "$py" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" \
    || fail "pip install -r requirements.txt"
}

# Prints a base port whose next $1 - 1 ports are free too (nothing when
# none is found), below the kernel's ephemeral range, so that no outgoing
# connection takes one of them before the cluster binds it. A race with
# another process is possible: the cluster then fails to start and the
# caller says so.
free_ports() {
  python3 - "$1" <<'PORTS'
import random, socket, sys
n = int(sys.argv[1])
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
except (OSError, ValueError, IndexError):
    ephemeral = 32768
for _ in range(50):
    base = random.randrange(10000, max(ephemeral - n, 10001))
    held = []
    try:
        for p in range(base, base + n):
            t = socket.socket(); t.bind(("127.0.0.1", p)); held.append(t)
        print(base); break
    except OSError:
        pass
    finally:
        for t in held: t.close()
PORTS
}
