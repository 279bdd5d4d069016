#!/usr/bin/env python3
"""Checks a binary's cargo-auditable section (.dep-v0: zlib-compressed JSON of the dependency
tree) against what cargo links for the target: every normal dependency of the `keyward` binary,
by name and version, is listed. Used by scripts/cross-check.sh.

    python3 scripts/dep_section.py BINARY TARGET
"""

import json
import subprocess
import sys
import tempfile
import zlib


def listed(binary):
    with tempfile.NamedTemporaryFile() as section:
        dump = subprocess.run(
            ["aarch64-linux-gnu-objcopy", "--dump-section", f".dep-v0={section.name}", binary, "/dev/null"],
            capture_output=True,
            text=True,
        )
        if dump.returncode != 0:
            sys.exit(f"dep_section: {binary} has no .dep-v0 section (built without cargo auditable?): {dump.stderr.strip()}")
        data = json.loads(zlib.decompress(section.read()))
    return {(p["name"], p["version"]) for p in data["packages"]}


def linked(target):
    """(name, version) of the packages `cargo tree` links into keyward for `target`."""
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "--offline", "-p", "keyward", "--target", target, "-e", "normal", "--prefix", "none", "--format", "{p}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    packages = set()
    for line in tree.splitlines():
        words = line.replace(" (*)", "").split()
        if len(words) >= 2 and words[1].startswith("v"):
            packages.add((words[0], words[1][1:]))
    return packages


def main():
    binary, target = sys.argv[1], sys.argv[2]
    have, want = listed(binary), linked(target)
    missing = sorted(want - have)
    if missing:
        print(f"dep_section: {binary}'s .dep-v0 lacks {len(missing)} linked crates: {missing[:10]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {binary} lists the {len(want)} crates linked for {target} ({len(have)} packages in .dep-v0)")


if __name__ == "__main__":
    main()
