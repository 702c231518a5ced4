#!/usr/bin/env python3
"""Print every value of KEY found anywhere in a JSON file, one per line (in document order)."""
import json
import sys


def walk(v, key):
    if isinstance(v, dict):
        for k, x in v.items():
            if k == key:
                yield x
            yield from walk(x, key)
    elif isinstance(v, list):
        for x in v:
            yield from walk(x, key)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: find_key.py FILE KEY")
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    for x in walk(doc, sys.argv[2]):
        print(json.dumps(x, sort_keys=True))
