"""Runs CPU-bound Python under the pyroscope-io SDK (push.v1), for Kiln's e2e tests.

Usage: python pyroscope_app.py SERVER_URL APP_NAME SECONDS
With KILN_BASIC_USER and KILN_BASIC_PASSWORD set, the SDK sends them as HTTP basic auth.
"""
import os
import sys
import time

import pyroscope


def kiln_py_fib(n):
    return n if n < 2 else kiln_py_fib(n - 1) + kiln_py_fib(n - 2)


def kiln_py_busy(seconds):
    end = time.time() + seconds
    while time.time() < end:
        kiln_py_fib(18)


def main():
    server, app, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    auth = {}
    if os.environ.get("KILN_BASIC_USER") is not None:
        auth = {
            "basic_auth_username": os.environ["KILN_BASIC_USER"],
            "basic_auth_password": os.environ["KILN_BASIC_PASSWORD"],
        }
    pyroscope.configure(
        application_name=app,
        server_address=server,
        sample_rate=100,
        upload_interval=1,
        tags={"e2e": "pyroscope-io"},
        **auth,
    )
    with pyroscope.tag_wrapper({"controller": "busy"}):
        kiln_py_busy(seconds)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
