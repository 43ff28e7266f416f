#!/usr/bin/env python3
"""Fails when an #include points up a layer.

The allowed edges are the table in README.md's "Layout" section: a layer's files may
include headers of their own folder and of the folders named in its "may include" column.
Folders not in the table (tests/, bench/, tools/) are not checked.

  scripts/check_layers.py [REPO_DIR]     check the tree (default: this script's repo)
  scripts/check_layers.py --self-test    check that a planted upward include is caught
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([a-z_0-9]+)/', re.MULTILINE)
ROW = re.compile(r'^\|\s*`([a-z_0-9]+)/`\s*\|[^|]*\|\s*([^|]*?)\s*\|\s*$')


def read_table(readme_path):
    """{layer: set of layers it may include}, from README's layout table."""
    allowed = {}
    with open(readme_path, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if not m:
                continue
            layer, cell = m.group(1), m.group(2)
            if cell.strip() == "every layer":
                allowed[layer] = None  # anything
            else:
                allowed[layer] = {w.strip() for w in cell.split(",") if w.strip() not in ("", "—")}
    if not allowed:
        raise SystemExit(f"check_layers: no layout table found in {readme_path}")
    for layer, deps in allowed.items():
        for dep in deps or ():
            if dep not in allowed:
                raise SystemExit(f"check_layers: README table: {layer} may include unknown layer '{dep}'")
    return allowed


def check(repo):
    allowed = read_table(os.path.join(repo, "README.md"))
    errors = []
    for layer, deps in sorted(allowed.items()):
        if deps is None:
            continue
        root = os.path.join(repo, layer)
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target == layer or target not in allowed or target in deps:
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    rel = os.path.relpath(path, repo)
                    errors.append(f"{rel}:{line}: {layer}/ includes {target}/, which is not below it "
                                  f"(README layout table: {layer} may include "
                                  f"{', '.join(sorted(deps)) or 'nothing'})")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "README.md"), "w") as f:
            f.write("| layer | what | may include |\n|---|---|---|\n"
                    "| `base/` | x | — |\n| `kv/` | x | base |\n| `apps/` | x | every layer |\n")
        os.makedirs(os.path.join(d, "base"))
        os.makedirs(os.path.join(d, "kv"))
        with open(os.path.join(d, "kv", "ok.h"), "w") as f:
            f.write('#include "base/status.h"\n#include "kv/other.h"\n#include <vector>\n')
        if check(d):
            return "a clean tree was reported"
        with open(os.path.join(d, "base", "bad.cc"), "w") as f:
            f.write('#include "base/x.h"\n\n#include "kv/kv_layout.h"\n')
        errors = check(d)
        if len(errors) != 1 or "base/bad.cc:3" not in errors[0]:
            return f"the upward include was not reported as expected: {errors}"
    return None


def main():
    if sys.argv[1:] == ["--self-test"]:
        problem = self_test()
        if problem:
            print(f"check_layers self-test FAILED: {problem}")
            return 1
        print("check_layers self-test passed")
        return 0
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errors = check(repo)
    for e in errors:
        print(e)
    if errors:
        print(f"check_layers: {len(errors)} include(s) point up a layer")
        return 1
    print("check_layers: every #include points down the layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
