"""A Leasehold client written from proto/leasehold.proto alone, in Python.

It talks mutual TLS to a coordinator cluster (`leasehold dev` mints the
certificates), checks grpc.health.v1, sets a policy as an operator, leases
as region `eu` with exactly-once request ids, follows leader hints, and
reads refusals by their google.rpc.ErrorInfo reason (and the
`leasehold-reason` trailer). Every expectation is asserted: the script
exits non-zero if the server does not behave as the proto says.

Usage:
  python leasehold_client.py --endpoint localhost:7100 --certs DIR
  python leasehold_client.py --endpoint HOST:PORT --endpoint HOST:PORT ... --certs DIR

The stubs leasehold_pb2*.py must be importable (run.sh generates them into
a temporary directory on PYTHONPATH). DIR holds ca.pem, operator-admin.pem/
.key and region-eu.pem/.key, as `leasehold dev` and `leasehold certs mint`
name them.
"""

import argparse
import secrets
import sys
import time

import grpc
import mmh3
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

import leasehold_pb2 as pb
import leasehold_pb2_grpc as rpc

ERROR_DOMAIN = "leasehold.v1"
OPERATOR = "operator-admin"  # may call Admin (docs/security.md)
REGION = "eu"
REGION_IDENTITY = f"region-{REGION}"  # may Lease for region eu only
DEADLINE_S = 10


def check(condition, what):
    """An expectation: prints `ok: ...`, or `FAIL: ...` and exits 1."""
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


class Refusal:
    """What a refused call says: its code, the leasehold.v1 ErrorInfo
    (reason and metadata) from the status details, and the trailers."""

    def __init__(self, error):
        self.code = error.code()
        self.message = error.details()
        self.trailers = {m.key: m.value for m in (error.trailing_metadata() or ())}
        self.reason, self.info = None, {}
        try:
            status = rpc_status.from_call(error)
        except ValueError:  # details that contradict the status: ignore them
            status = None
        for detail in status.details if status else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN:
                    self.reason, self.info = info.reason, dict(info.metadata)
        # The same reason for clients that cannot read status details.
        self.trailer_reason = self.trailers.get("leasehold-reason")
        self.leader_addr = self.info.get("leader_addr") or self.trailers.get(
            "leasehold-leader-addr"
        )

    def __str__(self):
        info = f"ErrorInfo {self.reason} {self.info}" if self.reason else "no ErrorInfo"
        trailer = self.trailer_reason or "(none)"
        return f"{self.code.name}, {info}, leasehold-reason {trailer}"


class Cluster:
    """Channels to the members, one per (member, identity), and calls that
    must reach the leader (Coordinator writes and GetWindow, Admin writes
    and ListPolicies)."""

    def __init__(self, endpoints, certs, server_name=None):
        self.endpoints = list(endpoints)  # the member that answered last first
        self.certs = certs
        self.server_name = server_name
        self.channels = {}
        self.hints_followed = 0

    def channel(self, endpoint, identity):
        """A mutual-TLS channel presenting `identity`'s certificate."""
        if (endpoint, identity) not in self.channels:

            def read(name):
                with open(f"{self.certs}/{name}", "rb") as f:
                    return f.read()

            credentials = grpc.ssl_channel_credentials(
                root_certificates=read("ca.pem"),
                private_key=read(f"{identity}.key"),
                certificate_chain=read(f"{identity}.pem"),
            )
            # Members' certificates name localhost and 127.0.0.1 in dev; for
            # an address the certificate does not name, check another name.
            options = []
            if self.server_name:
                options.append(("grpc.ssl_target_name_override", self.server_name))
            self.channels[(endpoint, identity)] = grpc.secure_channel(
                endpoint, credentials, options
            )
        return self.channels[(endpoint, identity)]

    def close(self):
        for ch in self.channels.values():
            ch.close()

    def on_leader(self, identity, stub_class, method, request, attempts=8):
        """Calls `method` on the leader. A member that does not lead refuses
        with FAILED_PRECONDITION, reason NOT_LEADER, and names the leader in
        `leasehold-leader-addr` (and ErrorInfo leader_addr); without a hint,
        or on UNAVAILABLE, try another member after a pause. Other refusals
        are the caller's. Retrying is safe: the writes sent here either carry
        a RequestId or are idempotent (SetPolicy replaces)."""
        targets = list(self.endpoints)
        for attempt in range(attempts):
            endpoint = targets[0]
            stub = stub_class(self.channel(endpoint, identity))
            try:
                response = getattr(stub, method)(request, timeout=DEADLINE_S)
            except grpc.RpcError as error:
                refusal = Refusal(error)
                hint = refusal.leader_addr
                if refusal.code == grpc.StatusCode.FAILED_PRECONDITION and hint:
                    print(f"  {endpoint} does not lead: following the hint to {hint}")
                    self.hints_followed += 1
                    targets = [hint] + [t for t in targets if t != hint]
                    continue
                if refusal.code == grpc.StatusCode.UNAVAILABLE or refusal.reason == "NOT_LEADER":
                    targets.append(targets.pop(0))  # no leader known there: another member
                    time.sleep(min(0.05 * 2**attempt, 1.0))
                    continue
                raise
            # Remember who answered: the next call goes there first.
            self.endpoints = [endpoint] + [e for e in self.endpoints if e != endpoint]
            return response
        raise RuntimeError(f"no leader answered {method} after {attempts} attempts")


class ShardRouter:
    """Routes each key's Lease to its shard's leader, from the placement
    alone (docs/operations.md, "Shards"; proto: the shards section): the
    key's slot is MurmurHash3 x64-128 (seed 0, the first 64 bits) modulo
    16384, GetPlacement maps slot ranges to shards and names each shard's
    leader where the member asked hosts it. A NOT_LEADER names the shard's
    leader (follow it); a NOT_OWNER says the placement moved (read it
    again, or follow its replica hint); SLOT_MOVING means wait a moment."""

    def __init__(self, cluster, identity):
        self.cluster = cluster
        self.identity = identity
        self.ranges = []   # (start, end, shard)
        self.leaders = {}  # shard -> address last known to lead it
        self.version = None
        self.calls = 0
        self.detours = 0   # calls answered by a redirection, not a grant

    @staticmethod
    def slot_of(key):
        return mmh3.hash64(key, 0, signed=False)[0] % 16384

    def refresh(self):
        """Reads the placement from every member (each names the leaders of
        the shards it hosts)."""
        for endpoint in self.cluster.endpoints:
            stub = rpc.CoordinatorStub(self.cluster.channel(endpoint, OPERATOR))
            placement = stub.GetPlacement(pb.GetPlacementRequest(), timeout=DEADLINE_S)
            self.version = placement.version
            self.ranges = [(r.start, r.end, r.shard) for r in placement.slots]
            for shard in placement.shards:
                if shard.HasField("leader_id") and shard.leader_addr:
                    self.leaders[shard.id] = shard.leader_addr

    def shard_of(self, key):
        slot = self.slot_of(key)
        return next(shard for (start, end, shard) in self.ranges if start <= slot < end)

    def lease(self, key, tokens, request_id):
        """One Lease at the key's shard leader, following redirections."""
        shard = self.shard_of(key)
        target = self.leaders.get(shard, self.cluster.endpoints[0])
        for attempt in range(20):
            self.calls += 1
            stub = rpc.CoordinatorStub(self.cluster.channel(target, self.identity))
            try:
                return shard, stub.Lease(
                    pb.LeaseRequest(key=key, region=REGION, tokens=tokens, request_id=request_id),
                    timeout=DEADLINE_S,
                )
            except grpc.RpcError as error:
                refusal = Refusal(error)
                self.detours += 1
                if refusal.reason in ("NOT_LEADER", "NOT_OWNER") and refusal.leader_addr:
                    if refusal.reason == "NOT_OWNER":
                        self.refresh()
                        shard = self.shard_of(key)
                    target = refusal.leader_addr
                    self.leaders[shard] = target
                    continue
                if refusal.code == grpc.StatusCode.UNAVAILABLE:
                    time.sleep(min(0.05 * 2**attempt, 0.5))
                    continue
                raise
        raise RuntimeError(f"{key}: no shard leader answered")


def expect_refusal(what, call, code, reason, info=None):
    """`call` must be refused with `code` and `reason`, both in ErrorInfo
    and in the `leasehold-reason` trailer (and ErrorInfo metadata ⊇ info)."""
    try:
        call()
    except grpc.RpcError as error:
        refusal = Refusal(error)
        print(f"  {what}: refused {refusal}")
        check(
            refusal.code == code
            and refusal.reason == reason
            and refusal.trailer_reason == reason
            and all(refusal.info.get(k) == v for k, v in (info or {}).items()),
            f"{what} is refused {code.name} / {reason}",
        )
        return refusal
    check(False, f"{what} is refused {code.name} / {reason} (it was answered)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--endpoint", action="append", required=True,
        help="a member, HOST:PORT (repeat for several; any member will do)",
    )
    parser.add_argument("--certs", required=True, help="directory of ca.pem and the identities")
    parser.add_argument("--tls-server-name", help="name to check in the members' certificates")
    args = parser.parse_args()
    cluster = Cluster(args.endpoint, args.certs, args.tls_server_name)
    try:
        run(cluster)
    except grpc.RpcError as error:
        print(f"FAIL: unexpected refusal: {Refusal(error)}: {error.details()}", file=sys.stderr)
        sys.exit(1)
    finally:
        cluster.close()


def run(cluster):
    endpoints = list(cluster.endpoints)
    # Health of every member: the process (""), and the coordinator
    # service, SERVING once the cluster is initialised and a leader known.
    for endpoint in cluster.endpoints:
        health = health_pb2_grpc.HealthStub(cluster.channel(endpoint, OPERATOR))
        for service in ["", "leasehold.v1.Coordinator"]:
            answer = health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S
            )
            check(
                answer.status == health_pb2.HealthCheckResponse.SERVING,
                f"{endpoint}: health of {service or 'the process'!r} is "
                f"{health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)}",
            )

    # An operator sets the policy: 100 tokens per 60 s window for "py/".
    policy = pb.Policy(prefix="py/", limit=100, window_ms=60_000)
    cluster.on_leader(OPERATOR, rpc.AdminStub, "SetPolicy", pb.SetPolicyRequest(policy=policy))
    listed = cluster.on_leader(OPERATOR, rpc.AdminStub, "ListPolicies", pb.ListPoliciesRequest())
    mine = [p for p in listed.policies if p.prefix == "py/"]
    check(
        len(mine) == 1 and mine[0].limit == 100 and mine[0].window_ms == 60_000,
        "the policy py/ (100 per 60000 ms) is set and listed",
    )

    # Region eu leases. One client id per process start; seqs increase.
    # The key is new per run, so that its window starts empty even when
    # the example runs twice within a minute against the same cluster.
    client_id = f"python-example-{secrets.token_hex(8)}"
    key = f"py/orders-{secrets.token_hex(4)}"
    print(f"  key {key}, client id {client_id}")

    def lease(tokens, seq, key=key, region=REGION):
        request = pb.LeaseRequest(
            key=key, region=region, tokens=tokens,
            request_id=pb.RequestId(client_id=client_id, seq=seq),
        )
        return cluster.on_leader(REGION_IDENTITY, rpc.CoordinatorStub, "Lease", request)

    def window():
        return cluster.on_leader(
            REGION_IDENTITY, rpc.CoordinatorStub, "GetWindow", pb.GetWindowRequest(key=key)
        )

    # Windows are epoch-aligned on the coordinator's clock: if this one
    # ends within seconds, start in the next one so that every lease
    # below counts against the same window.
    before = window()
    check(before.granted == 0, f"GetWindow of the new key: granted {before.granted}")
    left_ms = before.window_end_ms - before.coordinator_now_ms
    if left_ms < 10_000:
        print(f"  the window ends in {left_ms} ms: waiting for the next one")
        time.sleep(left_ms / 1000 + 0.2)

    first = lease(30, seq=1)
    check(first.granted == 30 and first.limit == 100, f"Lease 30 (seq 1): granted {first.granted} of {first.limit}")
    check(
        first.window_start_ms < first.window_end_ms
        and first.window_end_ms - first.window_start_ms == 60_000
        and first.window_start_ms % 60_000 == 0,
        f"the grant names its epoch-aligned window [{first.window_start_ms}, {first.window_end_ms})",
    )
    again = lease(30, seq=1)
    check(again == first, f"a retry with the same request id gets the first answer (granted {again.granted})")
    check(window().granted == 30, "and grants nothing more (GetWindow granted 30)")

    rest = lease(100, seq=2)
    check(rest.granted == 70, f"Lease 100 (seq 2): granted {rest.granted}, the rest of the window")
    denied = lease(5, seq=3)
    check(
        denied.granted == 0 and denied.window_end_ms == first.window_end_ms,
        f"Lease 5 (seq 3): granted 0, a denial, not an error (ask again after {denied.window_end_ms})",
    )
    now = window()
    eu = [r for r in now.regions if r.region == REGION]
    check(
        now.granted == 100 and len(eu) == 1 and eu[0].granted == 100,
        f"GetWindow: granted {now.granted} of {now.limit}, all to {REGION}",
    )

    # The same request id for another request: refused, nothing executed.
    expect_refusal(
        "Lease 7 with seq 3 again", lambda: lease(7, seq=3),
        grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED",
    )

    # Limits are in bytes: 256 bytes pass, 257 do not, however many
    # characters they are.
    key256 = "py/" + "k" * 253
    check(lease(1, seq=4, key=key256).granted == 1, "a key of 256 bytes is accepted")

    # Refusals carry their reason in ErrorInfo (and the leasehold-reason
    # trailer); the client branches on the reason, never on the message.
    region_ch = cluster.channel(cluster.endpoints[0], REGION_IDENTITY)
    coordinator = rpc.CoordinatorStub(region_ch)
    cases = [
        ("Lease on a key without a policy",
         pb.LeaseRequest(key="nopolicy/orders", region=REGION, tokens=1),
         grpc.StatusCode.NOT_FOUND, "NO_POLICY", {"key": "nopolicy/orders"}),
        ("Lease on a key of 257 bytes",
         pb.LeaseRequest(key="py/" + "k" * 254, region=REGION, tokens=1),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", {"field": "key"}),
        ("Lease on a key of 130 characters, 257 bytes",
         pb.LeaseRequest(key="py/" + "é" * 127, region=REGION, tokens=1),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", {"field": "key"}),
        ("Lease of 0 tokens",
         pb.LeaseRequest(key=key, region=REGION, tokens=0),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", {"field": "tokens"}),
        ("Lease by region eu for region us",
         pb.LeaseRequest(key=key, region="us", tokens=1),
         grpc.StatusCode.PERMISSION_DENIED, "OTHER_REGION", None),
    ]
    refusals = []
    for what, request, code, reason, info in cases:
        # Sent to the member that answered last (the leader); a NO_POLICY
        # or INVALID_FIELD is the same answer on any member.
        refusals.append(expect_refusal(
            what, lambda: coordinator.Lease(request, timeout=DEADLINE_S), code, reason, info
        ).reason)
    refusals.append(expect_refusal(
        "Admin.SetPolicy by region eu",
        lambda: rpc.AdminStub(region_ch).SetPolicy(
            pb.SetPolicyRequest(policy=policy), timeout=DEADLINE_S
        ),
        grpc.StatusCode.PERMISSION_DENIED, "NOT_PERMITTED",
    ).reason)

    # A `fair` key: the region fair pool. Region eu asks for a total,
    # hands back what it did not use (PoolRelease, compare-and-set on its
    # total), and a retry of the release gets the first answer.
    fair_key = f"pyf/chat-{secrets.token_hex(4)}"
    cluster.on_leader(OPERATOR, rpc.AdminStub, "SetPolicy", pb.SetPolicyRequest(
        policy=pb.Policy(prefix="pyf/", limit=100, window_ms=60_000, kind=pb.POLICY_KIND_FAIR)
    ))

    def fair_window():
        return cluster.on_leader(
            REGION_IDENTITY, rpc.CoordinatorStub, "GetWindow", pb.GetWindowRequest(key=fair_key)
        )

    ahead = fair_window()
    left_ms = ahead.window_end_ms - ahead.coordinator_now_ms
    if left_ms < 10_000:
        print(f"  the fair window ends in {left_ms} ms: waiting for the next one")
        time.sleep(left_ms / 1000 + 0.2)
        ahead = fair_window()

    def pool_grant(want, seq, demands=()):
        return cluster.on_leader(REGION_IDENTITY, rpc.CoordinatorStub, "PoolGrant", pb.PoolGrantRequest(
            key=fair_key, region=REGION, region_weight=1000, want_total=want,
            request_id=pb.RequestId(client_id=client_id, seq=seq),
            tenant_demands=[pb.TenantDemand(tenant=t, demand=d) for t, d in demands],
            demand_window_start_ms=ahead.window_start_ms - 60_000,
        ))

    def pool_release(from_total, keep_total, window_start_ms, seq):
        return cluster.on_leader(REGION_IDENTITY, rpc.CoordinatorStub, "PoolRelease", pb.PoolReleaseRequest(
            key=fair_key, region=REGION, from_total=from_total, keep_total=keep_total,
            window_start_ms=window_start_ms,
            request_id=pb.RequestId(client_id=client_id, seq=seq),
        ))

    grant = pool_grant(60, seq=10, demands=[("beta", 25)])
    check(grant.granted_total == 60, f"PoolGrant 60 alone in the pool: total {grant.granted_total}")
    check(
        [(d.tenant, d.demand) for d in grant.tenant_demands] == [("beta", 25)],
        "the demand report is answered with the tenant's total over the regions that reported it",
    )
    released = pool_release(60, 20, grant.window_start_ms, seq=11)
    check(
        released.disposition == pb.POOL_RELEASE_DISPOSITION_RELEASED
        and released.released == 40 and released.granted_total == 20,
        f"PoolRelease 60 -> keep 20: released {released.released}, total {released.granted_total}",
    )
    check(pool_release(60, 20, grant.window_start_ms, seq=11) == released,
          "a retried release gets the first answer")
    stale = pool_release(60, 0, grant.window_start_ms, seq=12)
    check(
        stale.disposition == pb.POOL_RELEASE_DISPOSITION_STALE_TOTAL and stale.granted_total == 20,
        f"a release from a stale total changes nothing and tells the real one ({stale.granted_total})",
    )
    eu_pool = [r for r in fair_window().regions if r.region == REGION]
    check(
        len(eu_pool) == 1 and eu_pool[0].granted == 20 and eu_pool[0].pool_weight == 0,
        "GetWindow: the retired region holds what it kept, with pool weight 0",
    )
    rejoined = pool_grant(100, seq=13)
    check(rejoined.granted_total == 100, f"asking again rejoins the pool: total {rejoined.granted_total}")
    expect_refusal(
        "PoolRelease keeping more than its total",
        lambda: pool_release(100, 101, grant.window_start_ms, seq=14),
        grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", {"field": "keep_total"},
    )

    # Holders: two escrow processes of one region, each naming itself. A
    # holder that knows the region's total as 10 asks for 5 more by
    # want_more after the other raised it to 20: it is granted 5 on top.
    held_key = "pyf/holders"

    def holder_grant(holder, want, more, seq):
        return cluster.on_leader(REGION_IDENTITY, rpc.CoordinatorStub, "PoolGrant", pb.PoolGrantRequest(
            key=held_key, region=REGION, region_weight=1000, want_total=want, want_more=more,
            holder=holder, request_id=pb.RequestId(client_id=client_id, seq=seq),
        ))

    holder_grant("py-holder-a", 10, 0, seq=20)
    holder_grant("py-holder-b", 20, 0, seq=21)
    more = holder_grant("py-holder-a", 15, 5, seq=22)
    check(
        more.granted_total == 25 and more.granted_increment == 5,
        f"want_more asks on top of what another holder added: total {more.granted_total}, "
        f"increment {more.granted_increment}",
    )
    expect_refusal(
        "PoolGrant naming a holder of 129 bytes",
        lambda: holder_grant("h" * 129, 1, 0, seq=23),
        grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", {"field": "holder"},
    )

    # Shards (ADR 0025): the slot of a key is computed here from the key
    # alone; the placement maps slots to shards. Shard 0 splits, its upper
    # half of slots going to a new shard on one member; a key leased before
    # the split keeps its window there, reached through any member by the
    # hints, and a member that does not host the shard says NOT_OWNER.
    def slot_of(k):
        return mmh3.hash64(k, 0, signed=False)[0] % 16384

    shard_key = next(
        k for k in (f"py/sharded-{secrets.token_hex(4)}-{i}" for i in range(1000))
        if slot_of(k) >= 8192
    )
    before_split = lease(40, seq=30, key=shard_key)
    check(before_split.granted == 40, f"Lease 40 of {shard_key} (slot {slot_of(shard_key)}) before the split")
    placement = rpc.CoordinatorStub(cluster.channel(cluster.endpoints[0], OPERATOR)).GetPlacement(
        pb.GetPlacementRequest(), timeout=DEADLINE_S
    )
    members = sorted((m.id, m.addr) for m in placement.shards[0].replica_addrs)
    check(
        placement.version == 0 and [(r.start, r.end, r.shard) for r in placement.slots] == [(0, 16384, 0)],
        f"GetPlacement: version {placement.version}, every slot on shard 0 ({len(members)} members)",
    )
    host_id, host_addr = members[-1]
    split = cluster.on_leader(OPERATOR, rpc.AdminStub, "ChangePlacement", pb.ChangePlacementRequest(
        expected_version=placement.version,
        split=pb.SplitShard(shard=0, into=1, replicas=[host_id]),
    ))
    check(
        split.version == 1 and [(r.start, r.end, r.shard) for r in split.slots] == [(0, 8192, 0), (8192, 16384, 1)],
        f"ChangePlacement split: version {split.version}, slots 8192.. on shard 1 (member {host_id})",
    )
    expect_refusal(
        "ChangePlacement against a stale version",
        lambda: cluster.on_leader(OPERATOR, rpc.AdminStub, "ChangePlacement", pb.ChangePlacementRequest(
            expected_version=0, remove_shard=pb.RemoveShard(shard=1),
        )),
        grpc.StatusCode.FAILED_PRECONDITION, "PLACEMENT_REFUSED",
    )
    # The shard forms and acquires the key's window in moments; meanwhile
    # the key is refused SLOT_MOVING (UNAVAILABLE): on_leader retries.
    after_split = cluster.on_leader(
        REGION_IDENTITY, rpc.CoordinatorStub, "Lease",
        pb.LeaseRequest(key=shard_key, region=REGION, tokens=100,
                        request_id=pb.RequestId(client_id=client_id, seq=31)),
        attempts=30,
    )
    check(
        after_split.granted == 60 and after_split.window_start_ms == before_split.window_start_ms,
        f"after the split the key's window goes on in shard 1: granted {after_split.granted} (40 before)",
    )
    others = [addr for (i, addr) in members if i != host_id]
    if others:
        elsewhere = rpc.CoordinatorStub(cluster.channel(others[0], REGION_IDENTITY))
        refusal = expect_refusal(
            f"Lease of the moved key at a member without shard 1 ({others[0]})",
            lambda: elsewhere.Lease(pb.LeaseRequest(key=shard_key, region=REGION, tokens=1), timeout=DEADLINE_S),
            grpc.StatusCode.FAILED_PRECONDITION, "NOT_OWNER", {"shard": "1", "placement_version": "1"},
        )
        check(refusal.leader_addr is not None, f"NOT_OWNER names a member to ask: {refusal.leader_addr}")
        refusals.append("NOT_OWNER")

    # A load generator routing by the placement on its own: 300 keys over
    # both shards, 3 leases each (the last asks for more than is left),
    # each sent to its shard's leader. Σ granted per key and window stays
    # within the limit (reaching it where the three leases fell in one
    # window), and once the router has learnt each shard's leader almost
    # every call is answered where it was sent.
    router = ShardRouter(cluster, REGION_IDENTITY)
    router.refresh()
    load_keys = [f"py/load-{secrets.token_hex(3)}-{i}" for i in range(300)]
    per_shard, per_key = {}, {}
    seq = 1000
    for round_tokens in (40, 40, 100):
        for k in load_keys:
            seq += 1
            shard, grant = router.lease(k, round_tokens, pb.RequestId(client_id=client_id, seq=seq))
            per_shard[shard] = per_shard.get(shard, 0) + 1
            window = (k, grant.window_start_ms)
            per_key[window] = per_key.get(window, 0) + grant.granted
    full = sum(1 for total in per_key.values() if total == 100)
    check(
        sorted(per_shard) == [0, 1] and max(per_key.values()) <= 100 and full >= 250,
        f"routed load: {sum(per_shard.values())} leases over shards {per_shard}; Σ granted per key and "
        f"window at most 100, exactly 100 for {full} of {len(load_keys)} keys",
    )
    check(
        router.detours <= 10,
        f"routed by the placement: {router.calls} calls, {router.detours} answered by a redirection",
    )

    print(
        f"PASS: the Python client behaved as the proto says "
        f"({len(set(endpoints))} member(s) given, leased 100 of 100 then a denial, "
        f"exactly-once retry, {cluster.hints_followed} leader hint(s) followed, "
        f"refusals {', '.join(refusals)})"
    )


if __name__ == "__main__":
    main()
