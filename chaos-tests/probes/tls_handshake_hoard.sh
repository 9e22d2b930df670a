#!/usr/bin/env bash
# Probe: one host hoarding TLS handshakes (docs/security.md, Resource limits).
# One TLS member on loopback; four threads on 127.0.0.2 keep 1 200
# connections open that send 5 bytes of a TLS record and stall (re-opened
# as the member closes them); meanwhile 41 leases from 127.0.0.1, each over
# a new connection with a 3 s deadline. Prints how many succeeded and the
# member's handshake counters.
#   usage: chaos-tests/probes/tls_handshake_hoard.sh target/debug/leasehold
set -u
B=$(realpath "$1"); DIR=$(mktemp -d); cd "$DIR"; P=27150
"$B" certs mint --out certs --members 1 --regions eu --operators admin --ip 127.0.0.1 >/dev/null 2>&1
TLS_M="--tls-ca certs/ca.pem --tls-cert certs/member-1.pem --tls-key certs/member-1.key"
"$B" serve --id 1 --listen 127.0.0.1:$P --data-dir data $TLS_M > serve.log 2>&1 &
SERVE=$!
sleep 1
OP="--ca certs/ca.pem --cert certs/operator-admin.pem --cert-key certs/operator-admin.key"
"$B" cluster init --endpoint 127.0.0.1:$P --member 1=127.0.0.1:$P --wait-secs 10 $OP > /dev/null 2>&1 || "$B" cluster init --help | head -3
"$B" policy set --endpoint 127.0.0.1:$P --prefix k/ --limit 1000000 --window-ms 600000 $OP > /dev/null 2>&1
python3 - <<'PY' &
import socket, time, threading
def hoard():
    conns = []
    while True:
        while len(conns) < 300:
            try:
                s = socket.socket(); s.bind(("127.0.0.2", 0)); s.settimeout(1)
                s.connect(("127.0.0.1", 27150)); s.send(b"\x16\x03\x01\x02\x00"); s.setblocking(False)
                conns.append(s)
            except Exception:
                pass
        for s in list(conns):
            try:
                if s.recv(1) == b"": conns.remove(s); s.close()
            except BlockingIOError: pass
            except Exception: conns.remove(s)
for _ in range(4):
    threading.Thread(target=hoard, daemon=True).start()
time.sleep(60)
PY
HOARD=$!
sleep 5
ok=0; fail=0
RG="--ca certs/ca.pem --cert certs/region-eu.pem --cert-key certs/region-eu.key"
for i in $(seq 1 41); do
  if timeout 5 "$B" lease --endpoint 127.0.0.1:$P --key k/a --region eu --tokens 1 --timeout-ms 3000 $RG > /dev/null 2>&1; then ok=$((ok+1)); else fail=$((fail+1)); fi
done
echo "leases over new connections while one host hoards handshakes: $ok ok, $fail failed"
"$B" cluster status --endpoint 127.0.0.1:$P $OP 2>/dev/null | grep -i "handshake\|refused" | head
kill $HOARD $SERVE 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"
