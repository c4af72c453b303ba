#!/usr/bin/env python3
"""Names the tests that did not run, for scripts/test.sh.

Two kinds: tests the build marked ignored (a cfg the build script sets when ../shared or a
tool is absent), listed by `cargo nextest list --run-ignored only`; and tests that ran but
printed kiln_otel::skip::MARKER and returned, found in nextest's JUnit report (which keeps
every test's output). Prints one line a test, `skipped: <test> (<reason>)`, then the count of
those that ran (`ran-but-skipped N`) and of all (`skipped N`) on the last two lines.

Usage: skipped.py JUNIT_XML IGNORED_LIST
"""

import sys
import xml.etree.ElementTree as ET

MARKER = "KILN-SKIPPED:"


def marked(junit_path):
    """(test, reason) of each test whose output carries the marker."""
    out = []
    root = ET.parse(junit_path).getroot()
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            text = "".join(
                (el.text or "") for el in case if el.tag in ("system-out", "system-err")
            )
            for line in text.splitlines():
                if MARKER in line:
                    reason = line.split(MARKER, 1)[1].strip()
                    out.append((f"{suite.get('name')} {case.get('name')}", reason))
                    break
    return out


def ignored(list_path):
    """Tests the build marked ignored, from nextest's oneline list."""
    with open(list_path) as f:
        return [(line.strip(), "ignored by the build") for line in f if line.strip()]


def main():
    ran = marked(sys.argv[1])
    names = ran + ignored(sys.argv[2])
    for name, reason in names:
        print(f"skipped: {name} ({reason})")
    print(f"ran-but-skipped {len(ran)}")
    print(f"skipped {len(names)}")


if __name__ == "__main__":
    main()
