#!/usr/bin/env python
"""Wait until the MLflow server of ``$RAYCPT_TRACKING_URI`` answers ``/health`` (at most SECONDS, default 300),
then exit 0; exit 1 with one line when it never did. The RayJob runs it before the sweep: the MLflow sidecar
beside Ray's head has no readiness probe (the head's readiness must not wait on it), so the job waits here.
Nothing to wait for (no ``RAYCPT_TRACKING_URI``, or not http): exit 0 at once."""

from __future__ import annotations

import os
import sys
import time
import urllib.request


def main(argv: list[str]) -> int:
    uri = os.environ.get("RAYCPT_TRACKING_URI", "")
    limit = float(argv[0]) if argv else 300.0
    if not uri.startswith(("http://", "https://")):
        return 0
    deadline, last = time.time() + limit, ""
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):  # noqa: S310 - the job's own server
                return 0
        except OSError as e:
            last = str(getattr(e, "reason", e))
            time.sleep(5)
    print(f"error: no MLflow server answered {uri}/health within {limit:g} s ({last})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
