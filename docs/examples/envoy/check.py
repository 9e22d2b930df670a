"""What run.sh checks through real Envoys in front of a Leasehold cluster.

Usage: check.py EU_URL US_URL ESCROW_PID_FILE

1. One global limit across regions: 300 requests of one tenant,
   alternating between the Envoy of region eu and the Envoy of region us
   (each asking its own region's escrow nodes: two in eu, one in us), are
   admitted at most 100 times in all — the rule's limit — and at least 90
   (each node sees enough requests to spend what it leased); a refused one
   is Envoy's 429 with the x-ratelimit-* headers the escrow node adds.
2. A dead escrow node costs no request: 400 requests through the eu Envoy
   (whose cluster lists both escrow nodes of eu), one node killed (SIGKILL)
   after the first 100: every request is answered 200 — none fails closed
   (503), thanks to the retry on another node and outlier detection of
   envoy.yaml.
Prints what it saw; exits 1 on the first broken expectation.
"""
import collections
import os
import signal
import sys
import urllib.error
import urllib.request


def get(url, tenant):
    request = urllib.request.Request(url, headers={"x-tenant": tenant})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    eu, us, pid_file = sys.argv[1:4]
    codes = collections.Counter()
    refused_headers = None
    for _ in range(150):
        for url in (eu, us):
            code, headers = get(url, "tenant-a")
            codes[code] += 1
            if code == 429 and refused_headers is None:
                refused_headers = headers
    print(f"one tenant through two regions' Envoys: {dict(codes)}")
    if set(codes) - {200, 429}:
        fail(f"answers other than 200 and 429: {dict(codes)}")
    if not 90 <= codes[200] <= 100:
        fail(f"{codes[200]} of 300 admitted under a global limit of 100")
    if refused_headers is None or refused_headers.get("x-ratelimit-limit", "").split(",")[0] != "100":
        fail(f"a refusal without x-ratelimit-limit 100: {refused_headers}")

    before, after = collections.Counter(), collections.Counter()
    for i in range(400):
        if i == 100:
            os.kill(int(open(pid_file).read()), signal.SIGKILL)
        code, _ = get(eu, "unbounded")
        (before if i < 100 else after)[code] += 1
    print(f"one of eu's two escrow nodes killed: before {dict(before)}, after {dict(after)}")
    if before != {200: 100} or after != {200: 300}:
        fail("a request failed around the escrow node's death")
    print("PASS")


if __name__ == "__main__":
    main()
