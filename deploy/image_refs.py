#!/usr/bin/env python3
"""keyward's image references in rendered manifests: checked, and pinned at release.

Every container image in a shipped manifest is either the release placeholder
(`ghcr.io/keyward/keyward:unreleased`, which names no image) or a reference pinned by digest
(`NAME@sha256:<64 hex>`), never a mutable tag. The release workflow renders the installs and
pins the placeholder to the digest it pushed; `check --release` then accepts digests only.

    python deploy/image_refs.py check [--release] FILE...      # a FILE of `-` reads stdin
    python deploy/image_refs.py pin --image NAME --digest sha256:HEX < rendered > pinned

Exits 0 when every reference passes; otherwise names each one (file, kind/name, container) and
exits 1. Pinning refuses a malformed digest or image name, and input without the placeholder.
"""

import argparse
import re
import sys

import yaml

PLACEHOLDER = "ghcr.io/keyward/keyward:unreleased"
# A registry path in lower case, as OCI distribution allows, and nothing after it.
NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def containers(node):
    """Every container (containers, initContainers, ephemeralContainers) anywhere in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                for container in value:
                    if isinstance(container, dict):
                        yield container
            else:
                yield from containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from containers(item)


def problems(text, source, release):
    """What is wrong with the image references of a multi-document YAML text."""
    found = []
    count = 0
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        where = f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"
        for container in containers(doc):
            count += 1
            image = container.get("image")
            label = f"{source}: {where} container {container.get('name', '?')!r}"
            if not isinstance(image, str):
                found.append(f"{label}: no image")
            elif image == PLACEHOLDER:
                if release:
                    found.append(f"{label}: still the placeholder {PLACEHOLDER}: pin it (image_refs.py pin)")
            elif "@" in image:
                name, digest = image.split("@", 1)
                if not NAME.match(without_tag(name)):
                    found.append(f"{label}: {image}: not a registry path")
                elif not DIGEST.match(digest):
                    found.append(f"{label}: {image}: the digest is not sha256:<64 lower-case hex>")
            else:
                found.append(
                    f"{label}: {image}: a tag can change under an install; use {PLACEHOLDER} (the release pins it) or NAME@sha256:DIGEST"
                )
    if count == 0:
        found.append(f"{source}: no containers: is this a rendered install?")
    return found


def without_tag(name):
    """`registry/path:tag` without `:tag` (a colon after the last `/`; a port comes before it)."""
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else name


def pin(text, image, digest):
    if not NAME.match(image):
        raise ValueError(f"--image {image!r}: not a registry path in lower case (e.g. ghcr.io/owner/keyward), with no tag")
    if not DIGEST.match(digest):
        raise ValueError(f"--digest {digest!r}: not sha256:<64 lower-case hex>")
    if PLACEHOLDER not in text:
        raise ValueError(f"the input holds no {PLACEHOLDER}: nothing to pin")
    return text.replace(PLACEHOLDER, f"{image}@{digest}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("--release", action="store_true", help="accept digests only")
    check.add_argument("files", nargs="+")
    pinning = sub.add_parser("pin")
    pinning.add_argument("--image", required=True)
    pinning.add_argument("--digest", required=True)
    args = parser.parse_args(argv)
    if args.command == "pin":
        try:
            sys.stdout.write(pin(sys.stdin.read(), args.image, args.digest))
        except ValueError as e:
            print(f"image_refs.py pin: {e}", file=sys.stderr)
            return 1
        return 0
    found = []
    for path in args.files:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        found += problems(text, "stdin" if path == "-" else path, args.release)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
