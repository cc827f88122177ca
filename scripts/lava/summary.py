#!/usr/bin/env python3
"""Summarise a finished lava-run from its output directory; used by scripts/lava-run.

Usage: summary.py OUTDIR     (reads OUTDIR/lava.log and OUTDIR/result.yaml)

Prints each `lvl: results` record of the log as `definition case result [measurement units]`,
then the job result from result.yaml, with the error type and message when it failed.
The log lines are YAML flow, not JSON (a missing measurement is logged as `! "null"`), hence
yaml.safe_load per line; lines that are not log records (tracebacks, plain prints) are skipped.
"""
import os
import sys

import yaml

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def records(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                rec = yaml.load(line, Loader=Loader)
            except yaml.YAMLError:
                continue
            if isinstance(rec, dict) and "lvl" in rec:
                yield rec


def present(value):
    return value is not None and value != "null" and value != ""


def main():
    out = sys.argv[1]
    log = os.path.join(out, "lava.log")
    if os.path.exists(log):
        for rec in records(log):
            msg = rec.get("msg")
            if rec["lvl"] != "results" or not isinstance(msg, dict):
                continue
            fields = [msg.get("definition"), msg.get("case"), msg.get("result")]
            if present(msg.get("measurement")):
                fields += [msg["measurement"], msg.get("units") if present(msg.get("units")) else ""]
            print(" ".join(str(x) for x in fields if x is not None and x != ""))

    try:
        with open(os.path.join(out, "result.yaml"), encoding="utf-8") as f:
            result = yaml.safe_load(f) or {}
    except FileNotFoundError:
        print(f"job result: none (lava-run wrote no result.yaml); end of {log}:")
        if os.path.exists(log):
            with open(log, encoding="utf-8", errors="replace") as f:
                for line in f.readlines()[-10:]:
                    print("  " + line.rstrip())
        return
    line = f"job result: {result.get('result')}"
    if result.get("result") != "pass":
        line += f" ({result.get('error_type')} error: {result.get('error_msg')})"
    print(line)


if __name__ == "__main__":
    main()
