#!/usr/bin/env python3
"""Render the device YAML for lava-run --device: a local QEMU "device", as lava-server would.

Usage: render-device.py --templates DIR --job JOB.yaml [--memory MiB] OUT.yaml

First it checks the job with lava_common.schemas.validate (non-strict, like lava-schema.py's
default): lava-run does not, and reports e.g. a missing `actions` as a LAVA bug (KeyError).

Why: lava-run wants the rendered device configuration, but the device-type templates
(qemu.jinja2, base.jinja2) ship only in lava-server, which renders a device dictionary with the
job's `context` when it schedules a job. Without a server this does the same: a dictionary that
extends qemu.jinja2 (arch amd64, no_kvm True, memory from --memory, else the job's
context.memory, else 1024), rendered with the job context like lava-server does (so context keys
such as extra_options still apply; the dictionary's own values win), then checked with
lava_common.schemas.device.validate.
no_kvm is always True: with -enable-kvm -cpu host, stock guests crashed on the fraglab host.
"""
import argparse
import sys

import voluptuous
import yaml
from jinja2 import FileSystemLoader
from jinja2.sandbox import SandboxedEnvironment
from lava_common.schemas import validate as validate_job
from lava_common.schemas.device import validate as validate_device

DICTIONARY = """{% extends 'qemu.jinja2' %}
{% set mac_addr = '52:54:00:12:34:59' %}
{% set memory = MEMORY %}
{% set arch = 'amd64' %}
{% set no_kvm = True %}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--templates", required=True, help="lava-server's device-types directory")
    ap.add_argument("--job", required=True, help="the LAVA job file (for its context)")
    ap.add_argument("--memory", type=int, help="guest memory in MiB")
    ap.add_argument("out")
    args = ap.parse_args()

    try:
        with open(args.job, encoding="utf-8") as f:
            job = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        sys.exit(f"render-device.py: cannot read the job {args.job}: {exc}")
    if not isinstance(job, dict):
        sys.exit(f"render-device.py: {args.job} is not a LAVA job (not a YAML mapping)")
    try:
        validate_job(job, strict=False)
    except voluptuous.Invalid as exc:
        sys.exit(f"render-device.py: invalid LAVA job {args.job}: {exc}")
    context = job.get("context") or {}
    memory = args.memory or context.get("memory") or 1024
    if not isinstance(memory, int) or memory <= 0:
        sys.exit(f"render-device.py: memory must be a positive number of MiB, got {memory!r}")

    # trim_blocks and the sandbox are what lava-server uses for device templates.
    env = SandboxedEnvironment(
        autoescape=False, trim_blocks=True, loader=FileSystemLoader([args.templates])
    )
    text = env.from_string(DICTIONARY.replace("MEMORY", str(memory))).render(**context)
    try:
        validate_device(yaml.safe_load(text))
    except voluptuous.Invalid as exc:
        sys.exit(f"render-device.py: rendered device is invalid: {exc}\n{text}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
