#!/usr/bin/env python3
"""Checks the Dockerfile's build stages without a Docker engine (CI has none).

The build context is assembled as Docker would send it (`.dockerignore` applied, by docker-py's
own matcher), and each stage's WORKDIR and COPY instructions are replayed into a scratch
directory. At every RUN that invokes cargo, the files copied so far must form a workspace that
cargo accepts as the RUN runs it: `cargo metadata --locked --offline` succeeds for every target
platform the Dockerfile builds, and every `--bin`/`-p`/`--profile` it names exists. Files that a RUN line
would create (stub sources of a hand-made dependency layer) are deliberately not modeled: such
a layer drifts from the workspace, and this check exists to catch exactly that.

Exits 0 when the Dockerfile passes; otherwise prints each problem with its line and exits 1.

    python deploy/check_image.py [REPO_ROOT]
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from glob import glob

from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

# The Rust targets the build stage builds for (on the build host, cross-compiling the other).
TARGET_PLATFORMS = ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu")
# Profiles cargo knows without a `[profile.NAME]` table.
BUILTIN_PROFILES = {"dev", "release", "test", "bench"}
CARGO = re.compile(r"(?:^|[\s;&|(])cargo\s+(\S+)(.*?)(?=&&|\|\||;|$)", re.S)


class Problem(Exception):
    pass


def dockerignore(root):
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def context_files(root):
    """Relative paths of the files Docker would send as the build context."""
    included = exclude_paths(root, dockerignore(root))
    return sorted(p for p in included if os.path.isfile(os.path.join(root, p)))


def copy_args(value):
    """(flags, sources, dest) of a COPY/ADD value, shell or JSON form."""
    words = shlex.split(value)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    rest = " ".join(words)
    if rest.startswith("["):
        words = json.loads(rest)
    if len(words) < 2:
        raise Problem(f"COPY needs a source and a destination: {value!r}")
    return flags, words[:-1], words[-1]


def replay_copy(line, flags, sources, dest, workdir, stage_root, root, files):
    unmodeled = set(flags) - {"chown", "chmod", "link"}
    if unmodeled:
        raise Problem(f"line {line}: COPY --{', --'.join(sorted(unmodeled))} is not modeled by this check")
    target = dest if dest.startswith("/") else os.path.join(workdir, dest)
    into_dir = dest.endswith("/") or len(sources) > 1 or dest in (".", "./")
    for src in sources:
        pattern = os.path.normpath(src).lstrip("/")
        matched = [f for f in files if f == pattern or f.startswith(pattern + "/") or pattern == "."]
        if any(ch in pattern for ch in "*?["):
            matched = [os.path.relpath(p, root) for p in glob(os.path.join(root, pattern))]
            matched = [f for f in files if any(f == m or f.startswith(m + "/") for m in matched)]
        if not matched:
            raise Problem(f"line {line}: COPY {src}: nothing in the build context matches (.dockerignore applied)")
        for f in matched:
            if pattern == ".":
                rel = f
            elif f == pattern:
                rel = os.path.basename(f) if into_dir else ""
            else:
                rel = os.path.relpath(f, pattern)
            out = os.path.join(stage_root, target.lstrip("/"), rel) if rel else os.path.join(stage_root, target.lstrip("/"))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            shutil.copy2(os.path.join(root, f), out)


def check_cargo(line, command, cwd):
    problems = []
    if not os.path.isfile(os.path.join(cwd, "Cargo.toml")):
        return [f"line {line}: `cargo` runs in {cwd!r} of the stage, where no Cargo.toml was copied"]
    metadata = None
    for platform in TARGET_PLATFORMS:
        run = subprocess.run(
            ["cargo", "metadata", "--locked", "--offline", "--format-version", "1", "--filter-platform", platform],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            problems.append(f"line {line}: cargo cannot read the workspace the COPY lines give it ({platform}):\n{run.stderr.strip()}")
            return problems
        metadata = json.loads(run.stdout)
    members = [p for p in metadata["packages"] if p["id"] in metadata["workspace_members"]]
    problems += missing_includes(line, members)
    bins = {t["name"] for p in members for t in p["targets"] if "bin" in t["kind"]}
    names = {p["name"] for p in members}
    profiles = BUILTIN_PROFILES | workspace_profiles(cwd)
    for sub, args in CARGO.findall(command):
        words = words_of(args)
        if sub == "auditable" and words:
            sub = f"auditable {words[0]}"  # cargo-auditable passes the rest to that subcommand
        named = (("--bin", bins, "binary"), ("-p", names, "package"), ("--package", names, "package"), ("--profile", profiles, "profile"))
        for flag, known, what in named:
            for i, w in enumerate(words):
                if w == flag and i + 1 < len(words) and words[i + 1] not in known:
                    problems.append(f"line {line}: cargo {sub} {flag} {words[i + 1]}: no such {what} in the workspace ({', '.join(sorted(known))})")
    return problems


def words_of(args):
    """The words of a cargo command's arguments, line continuations joined."""
    return shlex.split(args.replace("\\\n", " "), posix=True) if args.strip() else []


def check_install(line, command):
    """A `cargo install` of a tool (cargo-auditable): pinned, so that the image's build is."""
    problems = []
    for sub, args in CARGO.findall(command):
        words = words_of(args)
        if sub == "install" and ("--locked" not in words or "--version" not in words):
            problems.append(f"line {line}: cargo install {' '.join(words)}: pin the tool with --locked and --version")
    return problems


def workspace_profiles(cwd):
    """The `[profile.NAME]` tables of the workspace's root manifest."""
    with open(os.path.join(cwd, "Cargo.toml"), "rb") as f:
        return set(tomllib.load(f).get("profile", {}))


INCLUDE = re.compile(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)')


def missing_includes(line, members):
    """Files the members' sources include at compile time that the COPY lines left out."""
    problems = []
    # The innermost member owns a source (the root package's directory holds the others).
    dirs = sorted((os.path.dirname(m["manifest_path"]) for m in members), key=len, reverse=True)
    seen = set()
    for crate_dir in dirs:
        for dirpath, subdirs, names in os.walk(crate_dir):
            # A directory with a manifest of its own that is no member (vendor/rustls: a
            # dependency carried with a patch) is that package's: cargo builds only its library,
            # whose test-only includes are not shipped with it.
            subdirs[:] = [
                d
                for d in subdirs
                if os.path.join(dirpath, d) in dirs or not os.path.isfile(os.path.join(dirpath, d, "Cargo.toml"))
            ]
            for name in names:
                source = os.path.join(dirpath, name)
                if not name.endswith(".rs") or source in seen:
                    continue
                seen.add(source)
                with open(source, encoding="utf-8", errors="replace") as f:
                    for included in INCLUDE.findall(f.read()):
                        if not os.path.isfile(os.path.normpath(os.path.join(dirpath, included))):
                            rel = os.path.relpath(source, dirs[-1])
                            problems.append(
                                f"line {line}: {rel} includes {included!r}, which is not in the stage (.dockerignore or a COPY left it out)"
                            )
    return problems


def check(root):
    parser = DockerfileParser(path=os.path.join(root, "Dockerfile"))
    files = context_files(root)
    problems = []
    stages = {}
    scratch = tempfile.mkdtemp(prefix="keyward-image-check-")
    try:
        stage_root, workdir, checked = None, "/", 0
        for instr in parser.structure:
            kind, value, line = instr["instruction"], instr["value"], instr["startline"] + 1
            try:
                if kind == "FROM":
                    name = value.split()[-1] if " as " in value.lower() else str(len(stages))
                    stage_root = os.path.join(scratch, f"stage-{len(stages)}")
                    os.makedirs(stage_root)
                    stages[name] = stage_root
                    workdir = "/"
                elif kind == "WORKDIR":
                    workdir = value if value.startswith("/") else os.path.join(workdir, value)
                elif kind in ("COPY", "ADD"):
                    flags, sources, dest = copy_args(value)
                    if "from" in flags:
                        continue  # from another stage or image: not the build context
                    if kind == "ADD" and any(re.match(r"^[a-z]+://", s) for s in sources):
                        raise Problem(f"line {line}: ADD from a URL is not modeled by this check")
                    replay_copy(line, flags, sources, dest, workdir, stage_root, root, files)
                elif kind == "RUN" and CARGO.search(value):
                    if re.search(r"--mount=type=bind", value):
                        raise Problem(f"line {line}: RUN --mount=type=bind is not modeled by this check")
                    checked += 1
                    if all(sub == "install" for sub, _ in CARGO.findall(value)):
                        problems += check_install(line, value)
                    else:
                        problems += check_cargo(line, value, os.path.join(stage_root, workdir.lstrip("/")))
            except Problem as p:
                problems.append(str(p))
        if checked == 0:
            problems.append("no RUN line invokes cargo: nothing builds keyward")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return problems, checked


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, checked = check(root)
    if problems:
        for p in problems:
            print(f"Dockerfile: {p}", file=sys.stderr)
        sys.exit(1)
    print(f"Dockerfile: {checked} cargo step(s) see a complete workspace ({', '.join(TARGET_PLATFORMS)})")


if __name__ == "__main__":
    main()
