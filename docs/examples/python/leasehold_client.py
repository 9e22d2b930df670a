"""A Leasehold client written from proto/leasehold.proto alone, in Python.

It talks mutual TLS to a coordinator cluster (`leasehold dev` mints the
certificates), sets a policy as an operator, leases as region `eu` with
exactly-once request ids, follows a leader hint, and reads refusals by
their google.rpc.ErrorInfo reason. Every expectation is asserted: the
script exits non-zero if the server does not behave as the proto says.

Usage: python leasehold_client.py --endpoint localhost:7101 --certs DIR
(the stubs leasehold_pb2*.py must be importable; run.sh generates them).
"""

import argparse
import secrets
import sys

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

import leasehold_pb2 as pb
import leasehold_pb2_grpc as rpc

ERROR_DOMAIN = "leasehold.v1"
LEADER_ADDR = "leasehold-leader-addr"


def channel(endpoint, certs, identity):
    """A mutual-TLS channel presenting `identity` (e.g. "region-eu")."""

    def read(name):
        with open(f"{certs}/{name}", "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read(f"{identity}.key"),
        certificate_chain=read(f"{identity}.pem"),
    )
    return grpc.secure_channel(endpoint, credentials)


def refusal(error):
    """(code, reason, ErrorInfo metadata) of a refused call."""
    status = rpc_status.from_call(error)
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return error.code(), info.reason, dict(info.metadata)
    return error.code(), None, {}


def call_leader(endpoints, certs, identity, method, request, attempts=5):
    """Calls `method` on the leader: a member that does not lead refuses
    with NOT_LEADER and names the leader (ErrorInfo metadata leader_addr,
    also `leasehold-leader-addr` metadata); UNAVAILABLE means try another
    member or later. Retrying is safe when the request has a RequestId."""
    targets = list(endpoints)
    for _ in range(attempts):
        endpoint = targets[0]
        with channel(endpoint, certs, identity) as ch:
            try:
                return method(rpc.CoordinatorStub(ch), request)
            except grpc.RpcError as error:
                code, reason, details = refusal(error)
                if reason == "NOT_LEADER" and details.get("leader_addr"):
                    targets.insert(0, details["leader_addr"])
                elif code == grpc.StatusCode.UNAVAILABLE:
                    targets.append(targets.pop(0))
                else:
                    raise
    raise RuntimeError("no leader answered")


def check(condition, what):
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--certs", required=True)
    args = parser.parse_args()
    endpoint, certs = args.endpoint, args.certs

    # Health: the process, then the coordinator service (SERVING once the
    # cluster is initialised and a leader is known).
    with channel(endpoint, certs, "operator-admin") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ["", "leasehold.v1.Coordinator"]:
            answer = health.Check(health_pb2.HealthCheckRequest(service=service))
            check(
                answer.status == health_pb2.HealthCheckResponse.SERVING,
                f"health of {service or 'the process'!r} is SERVING",
            )

        # An operator sets the policy: 100 tokens per minute for "py/".
        admin = rpc.AdminStub(ch)
        admin.SetPolicy(
            pb.SetPolicyRequest(
                policy=pb.Policy(prefix="py/", limit=100, window_ms=60_000)
            )
        )
        prefixes = [p.prefix for p in admin.ListPolicies(pb.ListPoliciesRequest()).policies]
        check("py/" in prefixes, "the policy is listed")

    # A region leases. One client id per process start; seqs increase.
    client_id = f"python-example-{secrets.token_hex(8)}"
    key = f"py/orders-{secrets.token_hex(4)}"

    def lease(tokens, seq):
        request = pb.LeaseRequest(
            key=key,
            region="eu",
            tokens=tokens,
            request_id=pb.RequestId(client_id=client_id, seq=seq),
        )
        return call_leader([endpoint], certs, "region-eu", lambda s, r: s.Lease(r), request)

    def granted_in_window():
        request = pb.GetWindowRequest(key=key)
        window = call_leader(
            [endpoint], certs, "region-eu", lambda s, r: s.GetWindow(r), request
        )
        return window.granted

    first = lease(30, seq=1)
    check(first.granted == 30 and first.limit == 100, f"granted 30 of 100 ({first.granted})")
    check(
        first.window_start_ms < first.window_end_ms,
        "the grant names its window [start, end)",
    )
    again = lease(30, seq=1)
    check(
        again.granted == first.granted and again.window_start_ms == first.window_start_ms,
        "a retry with the same request id gets the first answer",
    )
    check(granted_in_window() == 30, "and grants nothing more")

    rest = lease(100, seq=2)
    check(rest.granted == 70, f"the rest of the window: 70 ({rest.granted})")
    denied = lease(5, seq=3)
    check(denied.granted == 0, "beyond the limit a lease is a denial (granted 0), not an error")

    # The same request id for another request: refused, nothing executed.
    try:
        lease(7, seq=3)
        check(False, "a reused request id is refused")
    except grpc.RpcError as error:
        code, reason, _ = refusal(error)
        check(
            code == grpc.StatusCode.ALREADY_EXISTS and reason == "REQUEST_ID_REUSED",
            f"a reused request id is refused: {code.name} {reason}",
        )

    # Refusals carry their reason in ErrorInfo.
    with channel(endpoint, certs, "region-eu") as ch:
        coordinator = rpc.CoordinatorStub(ch)
        cases = [
            (
                pb.LeaseRequest(key="nopolicy/k", region="eu", tokens=1),
                grpc.StatusCode.NOT_FOUND,
                "NO_POLICY",
                ("key", "nopolicy/k"),
            ),
            (
                pb.LeaseRequest(key="k" * 257, region="eu", tokens=1),
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_FIELD",
                ("field", "key"),
            ),
            (
                pb.LeaseRequest(key=key, region="us", tokens=1),
                grpc.StatusCode.PERMISSION_DENIED,
                "OTHER_REGION",
                None,
            ),
        ]
        for request, expected_code, expected_reason, detail in cases:
            try:
                coordinator.Lease(request)
                check(False, f"{expected_reason} is refused")
            except grpc.RpcError as error:
                code, reason, details = refusal(error)
                trailing = dict(error.trailing_metadata() or ())
                check(
                    code == expected_code
                    and reason == expected_reason
                    and trailing.get("leasehold-reason") == expected_reason
                    and (detail is None or details.get(detail[0]) == detail[1]),
                    f"refused {code.name}, reason {reason}, details {details}",
                )

    print("PASS: the Python client behaved as the proto says")


if __name__ == "__main__":
    main()
