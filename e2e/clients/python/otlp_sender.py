"""Sends OTLP profiles (proto 1.10, the PyPI opentelemetry-proto stubs) to Kiln for its e2e tests:
links (span and trace ids), attributes given by string-table reference, per-sample timestamps.
The same request goes over gRPC and over HTTP (application/x-protobuf), to two tenants.

Usage: python otlp_sender.py HOST:PORT GRPC_TENANT HTTP_TENANT
Prints one JSON object: what was sent, for the test to compare with Kiln's answers.
"""
import json
import sys
import time
import urllib.request

import grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as svc,
    profiles_service_pb2_grpc as svc_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2 as common
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1 import resource_pb2 as resource

PERIOD = 10_000_000  # 100 Hz


def build():
    d = pb.ProfilesDictionary()
    strings = [""]

    def s(value):
        if value not in strings:
            strings.append(value)
        return strings.index(value)

    d.mapping_table.add()
    d.location_table.add()
    d.function_table.add()
    d.stack_table.add()
    d.attribute_table.add()
    d.link_table.add(trace_id=bytes(16), span_id=bytes(8))

    def stack(root_first):
        locs = []
        for name in reversed(root_first):
            d.function_table.add(name_strindex=s(name), filename_strindex=s("app.py"))
            d.location_table.add(lines=[pb.Line(function_index=len(d.function_table) - 1, line=7)])
            locs.append(len(d.location_table) - 1)
        d.stack_table.add(location_indices=locs)
        return len(d.stack_table) - 1

    def attr(key, value):
        d.attribute_table.add(key_strindex=s(key), value=common.AnyValue(string_value=value))
        return len(d.attribute_table) - 1

    def link(trace_hex, span_hex):
        d.link_table.add(trace_id=bytes.fromhex(trace_hex), span_id=bytes.fromhex(span_hex))
        return len(d.link_table) - 1

    checkout = stack(["main", "handle_checkout", "otlp_charge_card"])
    search = stack(["main", "handle_search", "otlp_rank_results"])
    idle = stack(["main", "otlp_idle_loop"])
    thread = attr("thread.name", "worker-7")
    region = attr("region", "eu-west")
    trace_a, span_a = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    trace_b, span_b = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    link_a = link(trace_a, span_a)
    link_b = link(trace_b, span_b)

    t0 = int(time.time()) * 1_000_000_000 - 60_000_000_000
    profile = pb.Profile(
        sample_type=pb.ValueType(type_strindex=s("samples"), unit_strindex=s("count")),
        period_type=pb.ValueType(type_strindex=s("cpu"), unit_strindex=s("nanoseconds")),
        period=PERIOD,
        time_unix_nano=t0,
        duration_nano=30_000_000_000,
    )
    # Timestamps only: each counts one sample of one period.
    profile.samples.add(stack_index=checkout, attribute_indices=[thread, region], link_index=link_a,
                        timestamps_unix_nano=[t0 + i * 1_000_000_000 for i in range(5)])
    # One value per timestamp.
    profile.samples.add(stack_index=search, attribute_indices=[thread, region], link_index=link_b,
                        values=[2, 3], timestamps_unix_nano=[t0 + 10_000_000_000, t0 + 20_000_000_000])
    # One aggregated value, no link, no timestamps.
    profile.samples.add(stack_index=idle, attribute_indices=[region], values=[4])

    # Resource attributes by reference: key and value are string-table indices.
    res = resource.Resource(attributes=[
        common.KeyValue(key_strindex=s("service.name"),
                        value=common.AnyValue(string_value_strindex=s("otlp-python-svc"))),
        common.KeyValue(key="deployment.environment", value=common.AnyValue(string_value="e2e")),
    ])
    d.string_table.extend(strings)
    req = svc.ExportProfilesServiceRequest(dictionary=d)
    rp = req.resource_profiles.add(resource=res)
    sp = rp.scope_profiles.add(scope=common.InstrumentationScope(name="kiln-e2e"))
    sp.profiles.append(profile)
    expected = {
        "service": "otlp-python-svc",
        "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "total": (5 + 2 + 3 + 4) * PERIOD,
        "spans": {span_a: 5 * PERIOD, span_b: 5 * PERIOD},
        "traces": {trace_a: 5 * PERIOD, trace_b: 5 * PERIOD},
        "stacks": {
            "main;handle_checkout;otlp_charge_card": 5 * PERIOD,
            "main;handle_search;otlp_rank_results": 5 * PERIOD,
            "main;otlp_idle_loop": 4 * PERIOD,
        },
        "first_ms": t0 // 1_000_000,
        "last_ms": (t0 + 20_000_000_000) // 1_000_000,
    }
    return req, expected


def main():
    addr, grpc_tenant, http_tenant = sys.argv[1], sys.argv[2], sys.argv[3]
    req, expected = build()
    with grpc.insecure_channel(addr) as channel:
        stub = svc_grpc.ProfilesServiceStub(channel)
        resp = stub.Export(req, metadata=[("x-scope-orgid", grpc_tenant)], timeout=30)
        expected["grpc_partial_success"] = resp.HasField("partial_success")
    http = urllib.request.Request(
        f"http://{addr}/v1development/profiles",
        data=req.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": http_tenant},
        method="POST",
    )
    with urllib.request.urlopen(http, timeout=30) as r:
        body = r.read()
        expected["http_status"] = r.status
        expected["http_content_type"] = r.headers.get("Content-Type")
        parsed = svc.ExportProfilesServiceResponse.FromString(body)
        expected["http_partial_success"] = parsed.HasField("partial_success")
    print(json.dumps(expected))


if __name__ == "__main__":
    main()
