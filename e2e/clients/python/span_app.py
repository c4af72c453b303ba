"""Two root spans doing different work under pyroscope-otel, for Kiln's e2e tests.

Usage: python span_app.py SERVER_URL APP_NAME
Prints the two root spans' ids as JSON when done.
"""
import json
import sys
import time

import pyroscope
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from pyroscope.otel import PyroscopeSpanProcessor


def kiln_span_alpha_work(seconds):
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        x += sum(i * i for i in range(2000))
    return x


def kiln_span_beta_work(seconds):
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        x += len(sorted(str(i) for i in range(2000)))
    return x


def main():
    server, app = sys.argv[1], sys.argv[2]
    pyroscope.configure(application_name=app, server_address=server, sample_rate=100, upload_interval=1)
    provider = TracerProvider()
    provider.add_span_processor(PyroscopeSpanProcessor())
    tracer = provider.get_tracer("kiln-e2e")
    spans = {}
    with tracer.start_as_current_span("alpha") as span:
        spans["alpha"] = format(span.get_span_context().span_id, "016x")
        kiln_span_alpha_work(1.5)
    with tracer.start_as_current_span("beta") as span:
        spans["beta"] = format(span.get_span_context().span_id, "016x")
        kiln_span_beta_work(1.5)
    pyroscope.shutdown()
    print(json.dumps(spans))


if __name__ == "__main__":
    main()
