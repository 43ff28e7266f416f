#!/usr/bin/env python3
"""Python's `re` as the reference for grammar/regex_automaton: full matches, ASCII classes.

  regex_reference.py REQUEST RESPONSE
REQUEST: {"cases": [{"pattern": P, "strings": [S, ...]}, ...]}
RESPONSE: {"results": [[bool, ...], ...]} (fullmatch of each string), or for a pattern
Python cannot compile, {"error": "..."} in its place.
"""
import json
import re
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    request = json.load(f)
results = []
for case in request["cases"]:
    try:
        compiled = re.compile(case["pattern"], re.ASCII)
    except re.error as e:
        results.append({"error": str(e)})
        continue
    results.append([compiled.fullmatch(s) is not None for s in case["strings"]])
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump({"results": results}, f)
