#!/usr/bin/env python3
"""Run Debian's unpacked lava-run with LAVA's scratch directory moved; used by scripts/lava-run.

Usage (with target/python-tools/python, which puts lava_common/lava_dispatcher on PYTHONPATH):
    lava-run-local.py SCRATCH_DIR LAVA_RUN_SCRIPT [lava-run arguments...]

Why: lava-run keeps downloaded images and overlays in
lava_common.constants.DISPATCHER_DOWNLOAD_DIR (/var/lib/lava/dispatcher/tmp/<job-id>), which
needs the lava-dispatcher package's /var/lib/lava and is shared by every job on the host.
lava_dispatcher modules copy that constant at import time (`from lava_common.constants import
DISPATCHER_DOWNLOAD_DIR`), so it is changed here before lava-run imports any of them; then each
run has its own scratch directory and /var/lib/lava is never touched.
"""
import os
import runpy
import sys

if len(sys.argv) < 3 or not os.path.isabs(sys.argv[1]):
    sys.exit("usage: lava-run-local.py /ABSOLUTE/SCRATCH_DIR LAVA_RUN_SCRIPT [lava-run args...]")
scratch, lava_run = sys.argv[1], sys.argv[2]

import lava_common.constants  # noqa: E402  (must come before any lava_dispatcher import)

if "lava_dispatcher" in sys.modules:
    sys.exit("lava-run-local.py: lava_dispatcher was imported before the scratch dir was moved")
lava_common.constants.DISPATCHER_DOWNLOAD_DIR = scratch
os.makedirs(scratch, exist_ok=True)

sys.argv = ["lava-run"] + sys.argv[3:]
runpy.run_path(lava_run, run_name="__main__")
