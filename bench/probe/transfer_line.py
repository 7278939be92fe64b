#!/usr/bin/env python3
"""One line from a `zerohop ... --json` report on stdin: the rate, the route
and where the workers' time went, of the first transfer in it (a load's
report, or the stats nested in a checkpoint command's).

    zerohop checkpoint restore DIR --json | python3 bench/probe/transfer_line.py
"""
import json
import sys


def transfer(doc):
    """The first object holding a worker profile, depth first."""
    if isinstance(doc, dict):
        if "profile" in doc and "gbps" in doc:
            return doc
        children = doc.values()
    elif isinstance(doc, list):
        children = doc
    else:
        return None
    for child in children:
        found = transfer(child)
        if found:
            return found
    return None


def main() -> None:
    t = transfer(json.load(sys.stdin))
    if t is None:
        raise SystemExit("no transfer with a profile in this report")
    p = t["profile"]
    print(f"{t['gbps']:6.2f} GB/s  io {p['io_seconds']:.2f} s  check {p['check_seconds']:.2f} s  "
          f"queue {p['queue_seconds']:.2f} s  wait {p['copy_wait_seconds']:.2f} s  via {t['path']}")


if __name__ == "__main__":
    main()
