"""An independent check of Envoy's rate limit service (RLS v3) on Leasehold escrow nodes.

The client is Envoy's own: `envoy.service.ratelimit.v3.RateLimitService`
stubs as the `xds-protos` package publishes them on PyPI, nothing from this
repository's protos. It connects over mutual TLS as Envoy would (the
certificate of the service `app` of region eu), sends `ShouldRateLimit`
requests for the rules of ratelimit.yaml (domain `edge`) and asserts every
field of the answers, the refusals of bad input (google.rpc.ErrorInfo,
domain `leasehold.v1`), who may call, and that the escrow nodes of two
regions share one budget per descriptor. It prints `ok: ...` per check and
exits 1 with `FAIL: ...` at the first one that does not hold.

Usage:
  python envoy_rls_check.py --eu 127.0.0.1:7201 --us 127.0.0.1:7202 --certs DIR

The nodes must serve ratelimit.yaml (`leasehold dev --ratelimit-config
docs/examples/python/ratelimit.yaml`, which also sets the policies its rules
stand for) on a cluster where its fixed values (user=vip, generic_key=tried)
have not been spent this hour: a fresh one, as run-rls.sh starts. DIR holds
ca.pem, service-app-eu.pem/.key and service-app-us.pem/.key, as `leasehold
dev` names them.
"""

import argparse
import concurrent.futures
import math
import secrets
import sys
import time

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.type.v3 import ratelimit_unit_pb2
from google.protobuf import wrappers_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DOMAIN = "edge"  # ratelimit.yaml
ERROR_DOMAIN = "leasehold.v1"
DEADLINE_S = 10
U32_MAX = 4_294_967_295
# Envoy's RateLimitDescriptor field 4, `bool is_negative_hits` (newer than
# some published stubs: sent as the raw field where the stub lacks it).
NEGATIVE_HITS_FIELD = b"\x20\x01"

Code = rls_pb2.RateLimitResponse.Code
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
Descriptor = ratelimit_pb2.RateLimitDescriptor


def check(condition, what):
    """An expectation: prints `ok: ...`, or `FAIL: ...` and exits 1."""
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def fresh(name):
    """A value no earlier run has spent from."""
    return f"{name}-{secrets.token_hex(4)}"


def descriptor(entries, hits=None, limit=None, negative=False):
    """A request descriptor of (key, value) entries; `hits` its own
    hits_addend, `limit` a (requests_per_unit, unit) override."""
    d = Descriptor(entries=[Descriptor.Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        d.limit.CopyFrom(Descriptor.RateLimitOverride(requests_per_unit=limit[0], unit=limit[1]))
    if negative:
        if "is_negative_hits" in Descriptor.DESCRIPTOR.fields_by_name:
            d.is_negative_hits = True
        else:
            d.MergeFromString(NEGATIVE_HITS_FIELD)
    return d


def request(descriptors, hits=1, domain=DOMAIN):
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


def code_name(code):
    return Code.Name(code)


def reset_s(status):
    """duration_until_reset in seconds (None when unset)."""
    if not status.HasField("duration_until_reset"):
        return None
    d = status.duration_until_reset
    return d.seconds + d.nanos / 1e9


def headers(answer):
    return {h.key: h.value for h in answer.response_headers_to_add}


def describe(answer):
    statuses = []
    for s in answer.statuses:
        limit = (
            f" limit {s.current_limit.requests_per_unit}/{Unit.Name(s.current_limit.unit)}"
            if s.HasField("current_limit") else ""
        )
        reset = reset_s(s)
        statuses.append(
            f"{code_name(s.code)}{limit} remaining {s.limit_remaining}"
            + (f" reset {reset:.3f}s" if reset is not None else "")
        )
    return f"overall {code_name(answer.overall_code)} [{'; '.join(statuses)}] headers {headers(answer)}"


class Refusal:
    """What a refused call says: its code, the leasehold.v1 ErrorInfo
    (reason and metadata) from the status details, and the trailers."""

    def __init__(self, error):
        self.code = error.code()
        self.trailers = {m.key: m.value for m in (error.trailing_metadata() or ())}
        self.reason, self.info = None, {}
        try:
            status = rpc_status.from_call(error)
        except ValueError:
            status = None
        for detail in status.details if status else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN:
                    self.reason, self.info = info.reason, dict(info.metadata)
        self.trailer_reason = self.trailers.get("leasehold-reason")

    def __str__(self):
        info = f"ErrorInfo {self.reason} {self.info}" if self.reason else "no ErrorInfo"
        return f"{self.code.name}, {info}, leasehold-reason {self.trailer_reason or '(none)'}"


class Nodes:
    """Mutual-TLS channels to the escrow nodes, one per (node, identity)."""

    def __init__(self, certs, server_name=None):
        self.certs = certs
        self.server_name = server_name
        self.channels = []

    def read(self, name):
        with open(f"{self.certs}/{name}", "rb") as f:
            return f.read()

    def stub(self, endpoint, identity):
        """A RateLimitService stub presenting `identity`'s certificate (None:
        no client certificate at all)."""
        if identity is None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self.read("ca.pem"))
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.read("ca.pem"),
                private_key=self.read(f"{identity}.key"),
                certificate_chain=self.read(f"{identity}.pem"),
            )
        options = []
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        channel = grpc.secure_channel(endpoint, credentials, options)
        self.channels.append(channel)
        return rls_pb2_grpc.RateLimitServiceStub(channel)

    def close(self):
        for channel in self.channels:
            channel.close()


def refused(call):
    """The refusal of `call`, or None when it was answered."""
    try:
        call()
    except grpc.RpcError as error:
        return Refusal(error)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eu", required=True, help="the escrow node of region eu, HOST:PORT")
    parser.add_argument("--us", required=True, help="the escrow node of region us, HOST:PORT")
    parser.add_argument("--certs", required=True, help="directory of ca.pem and service-app-*.pem/.key")
    parser.add_argument("--tls-server-name", help="name to check in the nodes' certificates")
    parser.add_argument(
        "--without-policy", metavar="KEY",
        help="a descriptor key of ratelimit.yaml whose policy was deleted from the cluster "
        "(run-rls.sh: unpoliced): its descriptors must be refused NOT_FOUND / NO_POLICY",
    )
    args = parser.parse_args()
    nodes = Nodes(args.certs, args.tls_server_name)
    try:
        run(nodes, args.eu, args.us, args.without_policy)
    except grpc.RpcError as error:
        print(f"FAIL: unexpected refusal: {Refusal(error)}: {error.details()}", file=sys.stderr)
        sys.exit(1)
    finally:
        nodes.close()


def run(nodes, eu_endpoint, us_endpoint, without_policy=None):
    eu = nodes.stub(eu_endpoint, "service-app-eu")
    us = nodes.stub(us_endpoint, "service-app-us")

    def ask(req, stub=eu):
        return stub.ShouldRateLimit(req, timeout=DEADLINE_S)

    # Windows are epoch-aligned: when this hour's ends within 30 s,
    # start in the next one, so that each hourly budget below is spent in
    # one window (told by the answer's duration_until_reset).
    probe = ask(request([descriptor([("remote_address", fresh("probe"))])]))
    left = reset_s(probe.statuses[0])
    check(left is not None and 0 < left <= 3600, f"a first answer: {describe(probe)}")
    if left < 30:
        print(f"  the hour ends in {left:.1f} s: waiting for the next one")
        time.sleep(left + 1)

    # --- A per-value rule: 5 an hour for each remote_address.
    address = fresh("10.0.0.1")
    for i in range(5):
        answer = ask(request([descriptor([("remote_address", address)])], hits=0))
        status = answer.statuses[0]
        reset = reset_s(status)
        h = headers(answer)
        check(
            answer.overall_code == Code.OK and len(answer.statuses) == 1 and status.code == Code.OK
            and status.HasField("current_limit")
            and status.current_limit.requests_per_unit == 5
            and status.current_limit.unit == Unit.HOUR
            and status.limit_remaining <= 5 - (i + 1)
            and reset is not None and 0 < reset <= 3600,
            f"hit {i + 1} of remote_address (hits_addend 0): OK, limit 5/HOUR, "
            f"remaining {status.limit_remaining} <= {5 - (i + 1)}, reset {reset} s in (0, 3600]",
        )
        check(
            h.get("x-ratelimit-limit") == "5, 5;w=3600"
            and h.get("x-ratelimit-remaining") == str(status.limit_remaining)
            and h.get("x-ratelimit-reset") == str(math.ceil(reset - 1e-9)),
            f"hit {i + 1}: headers {h} (limit, remaining, reset rounded up)",
        )
    over = ask(request([descriptor([("remote_address", address)])], hits=1))
    status = over.statuses[0]
    check(
        over.overall_code == Code.OVER_LIMIT and status.code == Code.OVER_LIMIT
        and status.limit_remaining == 0
        and status.current_limit.requests_per_unit == 5
        and status.current_limit.unit == Unit.HOUR
        and 0 < (reset_s(status) or 0) <= 3600
        and headers(over).get("x-ratelimit-remaining") == "0",
        f"the 6th hit of one address is OVER_LIMIT, remaining 0 (hits_addend 0 counted as 1): {describe(over)}",
    )
    other = fresh("10.0.0.2")
    answer = ask(request([descriptor([("remote_address", other)])], hits=3))
    check(
        answer.overall_code == Code.OK and answer.statuses[0].limit_remaining <= 2,
        f"another address has a budget of its own: 3 hits OK, remaining {answer.statuses[0].limit_remaining} <= 2",
    )

    # A descriptor's own hits_addend of 0 is check-only: it spends nothing.
    checked = fresh("10.0.0.4")
    for i in range(8):
        answer = ask(request([descriptor([("remote_address", checked)], hits=0)], hits=1))
        check(answer.overall_code == Code.OK, f"check-only {i + 1}: OK, nothing spent: {describe(answer)}")
    answer = ask(request([descriptor([("remote_address", checked)])], hits=5))
    check(answer.overall_code == Code.OK, f"after 8 checks all 5 hits are left: {describe(answer)}")

    # More hits than are left are charged what is left (recorded, as
    # upstream records every hit) and are OVER_LIMIT: the window is spent.
    big = fresh("10.0.0.3")
    answer = ask(request([descriptor([("remote_address", big)])], hits=6))
    check(
        answer.overall_code == Code.OVER_LIMIT and answer.statuses[0].limit_remaining == 0
        and answer.statuses[0].current_limit.requests_per_unit == 5,
        f"hits_addend 6 above the limit of 5 is OVER_LIMIT: {describe(answer)}",
    )
    answer = ask(request([descriptor([("remote_address", big)])], hits=1))
    check(answer.overall_code == Code.OVER_LIMIT, f"and spent the 5: one more hit is OVER_LIMIT: {describe(answer)}")

    # A descriptor's own hits_addend replaces the request's.
    answer = ask(request([descriptor([("remote_address", other)], hits=3)], hits=1))
    check(
        answer.overall_code == Code.OVER_LIMIT,
        f"descriptor hits_addend 3 (request 1) on an address with 2 left is OVER_LIMIT: {describe(answer)}",
    )
    answer = ask(request([descriptor([("remote_address", other)], hits=2)], hits=10))
    check(
        answer.overall_code == Code.OK and answer.statuses[0].limit_remaining == 0,
        f"descriptor hits_addend 2 (request 10) on that address is OK, remaining 0: {describe(answer)}",
    )

    # --- Unlimited, 0 requests, no rule, an empty descriptor.
    answer = ask(request([descriptor([("generic_key", "free")])], hits=7))
    status = answer.statuses[0]
    check(
        answer.overall_code == Code.OK and status.code == Code.OK
        and status.limit_remaining == U32_MAX and not status.HasField("current_limit")
        and not answer.response_headers_to_add,
        f"generic_key=free (unlimited): OK, remaining {status.limit_remaining}, no limit, no headers",
    )
    answer = ask(request([descriptor([("generic_key", "closed")])]))
    check(
        answer.overall_code == Code.OVER_LIMIT and answer.statuses[0].code == Code.OVER_LIMIT
        and answer.statuses[0].current_limit.requests_per_unit == 0
        and answer.statuses[0].current_limit.unit == Unit.HOUR,
        f"generic_key=closed (0 an hour): OVER_LIMIT: {describe(answer)}",
    )
    for what, entries in [("a descriptor no rule matches", [("nobody", "x")]), ("an empty descriptor", [])]:
        answer = ask(request([descriptor(entries)]))
        check(
            answer.overall_code == Code.OK and len(answer.statuses) == 1
            and answer.statuses[0].code == Code.OK
            and not answer.statuses[0].HasField("current_limit")
            and not answer.response_headers_to_add,
            f"{what}: OK without current_limit: {describe(answer)}",
        )
    mixed = ask(request([
        descriptor([("generic_key", "free")]),
        descriptor([("generic_key", "closed")]),
        descriptor([("nobody", "x")]),
        descriptor([]),
        descriptor([("remote_address", fresh("10.0.0.4"))]),
    ]))
    s = mixed.statuses
    check(
        len(s) == 5
        and s[0].code == Code.OK and s[0].limit_remaining == U32_MAX and not s[0].HasField("current_limit")
        and s[1].code == Code.OVER_LIMIT and s[1].current_limit.requests_per_unit == 0
        and s[2].code == Code.OK and not s[2].HasField("current_limit")
        and s[3].code == Code.OK and not s[3].HasField("current_limit")
        and s[4].code == Code.OK and s[4].current_limit.requests_per_unit == 5,
        f"one status per descriptor, in request order: {describe(mixed)}",
    )
    check(mixed.overall_code == Code.OVER_LIMIT, "the overall code is OVER_LIMIT when any status is")
    h = headers(mixed)
    check(
        h.get("x-ratelimit-limit") == "0, 0;w=3600" and h.get("x-ratelimit-remaining") == "0",
        f"the headers name the most constrained descriptor (closed): {h}",
    )

    # --- Shadow mode: OK whatever the count (1 an hour, asked 3 times).
    for i in range(3):
        answer = ask(request([descriptor([("generic_key", "tried")])]))
        status = answer.statuses[0]
        check(
            answer.overall_code == Code.OK and status.code == Code.OK
            and status.current_limit.requests_per_unit == 1
            and status.current_limit.unit == Unit.HOUR
            and status.limit_remaining <= 1,
            f"shadow_mode rule, hit {i + 1} of a limit of 1: OK ({describe(answer)})",
        )
        # Documented (core/src/rls/answer.rs): a shadow_mode rule reports
        # nothing left (its policy's grants exceed the limit).
        check(
            status.limit_remaining == 0
            and headers(answer).get("x-ratelimit-remaining") == "0",
            f"shadow_mode rule, hit {i + 1}: limit_remaining 0 and x-ratelimit-remaining 0",
        )

    # --- `replaces`: with plan=gold in the same request, user=vip is not limited.
    for i in range(4):
        both = ask(request([descriptor([("user", "vip")]), descriptor([("plan", "gold")])]))
        s = both.statuses
        check(
            both.overall_code == Code.OK and len(s) == 2
            and s[0].code == Code.OK and not s[0].HasField("current_limit")
            and s[1].code == Code.OK and s[1].current_limit.requests_per_unit == 100
            and s[1].current_limit.unit == Unit.HOUR,
            f"user=vip with plan=gold ({i + 1}): vip replaced (no limit), gold 100/HOUR: {describe(both)}",
        )
    for i, expected in enumerate([Code.OK, Code.OK, Code.OVER_LIMIT]):
        answer = ask(request([descriptor([("user", "vip")])]))
        check(
            answer.overall_code == expected and answer.statuses[0].current_limit.requests_per_unit == 2,
            f"user=vip alone, hit {i + 1} of 2 an hour (the replaced hits spent nothing): "
            f"{code_name(expected)} ({describe(answer)})",
        )

    # --- A nested rule: path=/login, then 3 a minute for each remote_address.
    while True:
        login_from = fresh("10.0.1.1")
        first = ask(request([descriptor([("path", "/login"), ("remote_address", login_from)])]))
        left = reset_s(first.statuses[0]) or 0
        if left >= 10:
            break
        print(f"  the minute ends in {left:.1f} s: starting again in the next one")
        time.sleep(left + 0.5)
    answers = [first] + [
        ask(request([descriptor([("path", "/login"), ("remote_address", login_from)])]))
        for _ in range(4)
    ]
    codes = [a.statuses[0].code for a in answers]
    check(
        codes == [Code.OK, Code.OK, Code.OK, Code.OVER_LIMIT, Code.OVER_LIMIT]
        and all(
            a.statuses[0].current_limit.requests_per_unit == 3
            and a.statuses[0].current_limit.unit == Unit.MINUTE
            and 0 < (reset_s(a.statuses[0]) or 0) <= 60
            for a in answers
        )
        and headers(answers[0]).get("x-ratelimit-limit") == "3, 3;w=60",
        f"nested path=/login -> remote_address, 3 a minute: {[code_name(c) for c in codes]} "
        f"(the 4th and 5th OVER_LIMIT)",
    )
    answer = ask(request([descriptor([("remote_address", login_from)])]))
    check(
        answer.overall_code == Code.OK and answer.statuses[0].current_limit.requests_per_unit == 5,
        f"the address alone spends from its own rule (5/HOUR), not the login one: {describe(answer)}",
    )
    answer = ask(request([descriptor([("path", "/login")])]))
    check(
        answer.overall_code == Code.OK and not answer.statuses[0].HasField("current_limit"),
        "path=/login alone: no rule at that level limits, OK without a limit",
    )

    # --- A domain no file configures limits nothing.
    answer = ask(request([descriptor([("remote_address", address)])], domain="elsewhere"))
    check(
        answer.overall_code == Code.OK and answer.statuses[0].code == Code.OK
        and not answer.statuses[0].HasField("current_limit")
        and not answer.response_headers_to_add,
        f"an unknown domain (an exhausted address): OK without a limit: {describe(answer)}",
    )

    # --- A limit override is not honoured; negative hits give back what this
    # caller was charged on the key in the window (here: its 5 hits).
    ignored = ask(request([
        descriptor([("remote_address", address)], hits=5, negative=True),
        descriptor([("nobody", "y")], limit=(1, ratelimit_unit_pb2.SECOND)),
    ]))
    check(
        ignored.overall_code == Code.OK
        and all(s.code == Code.OK and not s.HasField("current_limit") for s in ignored.statuses),
        f"is_negative_hits (on an exhausted address) and a limit override (no rule): OK without a limit: "
        f"{describe(ignored)}",
    )
    answer = ask(request([descriptor([("remote_address", address)])]))
    check(
        answer.overall_code == Code.OK,
        f"the negative hits gave the address's hits back: OK again: {describe(answer)}",
    )
    # 1 charged since: a refund of 100 gives back that 1 and no more.
    ask(request([descriptor([("remote_address", address)], hits=100, negative=True)]))
    answer = ask(request([descriptor([("remote_address", address)])], hits=5))
    check(answer.overall_code == Code.OK, f"5 hits fit again after the refund: {describe(answer)}")
    answer = ask(request([descriptor([("remote_address", address)])], hits=1))
    check(
        answer.overall_code == Code.OVER_LIMIT,
        f"a refund beyond what was charged gave back no more: a 6th hit is OVER_LIMIT: {describe(answer)}",
    )
    answer = ask(request([descriptor([("remote_address", fresh("10.0.0.5"))], limit=(1000, ratelimit_unit_pb2.SECOND))]))
    status = answer.statuses[0]
    check(
        answer.overall_code == Code.OK
        and status.current_limit.requests_per_unit == 5 and status.current_limit.unit == Unit.HOUR,
        f"a limit override (1000/SECOND) on a limited descriptor: the configured rule governs: {describe(answer)}",
    )

    # --- Bad input: INVALID_ARGUMENT, ErrorInfo INVALID_FIELD naming the field.
    bad_inputs = [
        ("an empty domain", request([descriptor([("remote_address", "a")])], domain=""), "domain"),
        ("no descriptors", request([]), "descriptors"),
        ("an entry with an empty key", request([descriptor([("", "a")])]), "descriptors.entries.key"),
        ("65 descriptors", request([descriptor([("k", "v")]) for _ in range(65)]), "descriptors"),
        ("a descriptor of 33 entries",
         request([descriptor([(f"k{i}", "v") for i in range(33)])]), "descriptors.entries"),
    ]
    for what, bad, field in bad_inputs:
        refusal = refused(lambda: ask(bad))
        check(
            refusal is not None and refusal.code == grpc.StatusCode.INVALID_ARGUMENT
            and refusal.reason == "INVALID_FIELD" and refusal.info.get("field") == field
            and refusal.trailer_reason == "INVALID_FIELD",
            f"{what}: refused INVALID_ARGUMENT, ErrorInfo field {field!r} ({refusal})",
        )
    answer = ask(request([descriptor([("remote_address", fresh("10.0.0.6"))])]))
    check(answer.overall_code == Code.OK, "the node keeps answering after bad input")

    # --- A rule whose policy the cluster no longer has: refused, naming the key.
    if without_policy:
        value = fresh("x")
        key = f"rls:{DOMAIN}/{without_policy}/|{value}"
        refusal = refused(lambda: ask(request([descriptor([(without_policy, value)])])))
        check(
            refusal is not None and refusal.code == grpc.StatusCode.NOT_FOUND
            and refusal.reason == "NO_POLICY" and refusal.trailer_reason == "NO_POLICY"
            and refusal.info.get("key") == key,
            f"{without_policy}={value} without its policy: refused NOT_FOUND, ErrorInfo NO_POLICY "
            f"key {key!r} ({refusal})",
        )
        answer = ask(request([descriptor([("generic_key", "free")])]))
        check(answer.overall_code == Code.OK, "an unlimited rule still answers OK (it needs no policy)")

    # --- Who may call: Envoy's certificate for this node's region only.
    asked = request([descriptor([("remote_address", fresh("10.0.0.7"))])])
    print("  (gRPC logs the TLS alert of the handshake the node refuses)")
    refusal = refused(lambda: nodes.stub(eu_endpoint, None).ShouldRateLimit(asked, timeout=DEADLINE_S))
    check(
        refusal is not None and refusal.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED),
        f"a client without a certificate is refused ({refusal})",
    )
    refusal = refused(lambda: nodes.stub(eu_endpoint, "service-app-us").ShouldRateLimit(asked, timeout=DEADLINE_S))
    check(
        refusal is not None and refusal.code == grpc.StatusCode.PERMISSION_DENIED
        and refusal.reason == "NOT_PERMITTED",
        f"region us's service certificate on the eu node is refused ({refusal})",
    )

    # --- Two regions, one budget: tenant=... allows 20 an hour in all.
    limit = 20
    tenant = fresh("acme")
    shared = request([descriptor([("tenant", tenant)])])

    def caller(stub):
        oks = []  # the window (its end, to the hour) of each OK
        for _ in range(12):
            answer = stub.ShouldRateLimit(shared, timeout=DEADLINE_S)
            if answer.overall_code == Code.OK:
                end = time.time() + (reset_s(answer.statuses[0]) or 0)
                oks.append(round(end / 3600))
        return oks

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        eu_runs, us_runs = [], []
        for _ in range(4):  # both regions at once
            us_runs.append(pool.submit(caller, us))
            eu_runs.append(pool.submit(caller, eu))
        eu_oks = [w for run in eu_runs for w in run.result()]
        us_oks = [w for run in us_runs for w in run.result()]
    per_window = {}
    for window in eu_oks + us_oks:
        per_window[window] = per_window.get(window, 0) + 1
    total = len(eu_oks) + len(us_oks)
    check(
        all(count <= limit for count in per_window.values()) and 1 <= total,
        f"one budget for both regions: {len(eu_oks)} OK on eu + {len(us_oks)} OK on us "
        f"= {total} <= {limit} per hour, of 96 asked",
    )

    print(
        "PASS: Envoy's RLS v3 client (xds-protos stubs) got the documented answers "
        "from the escrow nodes"
    )


if __name__ == "__main__":
    main()
