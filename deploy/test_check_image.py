#!/usr/bin/env python3
"""Tests of deploy/check_image.py: it passes the Dockerfile, and refuses a build stage that
drifted from the workspace (the hand-made dependency layer keyward shipped at 189e566) and a
.dockerignore that drops a file the sources include. Run by .ci/run:

    python deploy/test_check_image.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import check_image  # noqa: E402


def copy_of_repo(dest):
    """The tracked files of the repository (what a clean clone holds), in `dest`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue  # deleted in the working tree
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out)


def build_line():
    """The Dockerfile line of the RUN that builds keyward (where the problems are reported)."""
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    run = next(i for i, l in enumerate(lines) if "cargo auditable build" in l)
    while not lines[run].startswith("RUN "):
        run -= 1
    return run + 1


BUILD = build_line()


class CheckImage(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="keyward-image-test-")
        copy_of_repo(self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_the_dockerfile_passes(self):
        problems, checked = check_image.check(self.dir)
        self.assertEqual(problems, [])
        self.assertEqual(checked, 2)  # cargo install of cargo-auditable, then the build

    def test_an_unpinned_tool_is_refused(self):
        self.edit_dockerfile('--version "${CARGO_AUDITABLE_VERSION}" ', "")
        problems, _ = check_image.check(self.dir)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("cargo install --locked cargo-auditable: pin the tool with --locked and --version", problems[0])

    def test_a_hand_made_dependency_layer_that_drifted_is_refused(self):
        shutil.copy(os.path.join(HERE, "testdata", "Dockerfile.drifted"), os.path.join(self.dir, "Dockerfile"))
        problems, _ = check_image.check(self.dir)
        self.assertTrue(problems, "the drifted Dockerfile passed")
        self.assertTrue(
            problems[0].startswith("line 30: cargo cannot read the workspace the COPY lines give it"), problems[0]
        )

    def test_a_dockerignore_that_drops_an_included_file_is_refused(self):
        with open(os.path.join(self.dir, ".dockerignore"), "a", encoding="utf-8") as f:
            f.write("webhooks/profiles/\n")
        problems, _ = check_image.check(self.dir)
        self.assertEqual(
            problems,
            [
                f"line {BUILD}: webhooks/src/profile/load.rs includes '../../profiles/{name}.yaml', which is not in the stage (.dockerignore or a COPY left it out)"
                for name in ("lmeval", "kfp")
            ],
        )

    def test_a_vendored_crate_is_its_own_not_a_members(self):
        # vendor/rustls's test modules include files the published crate leaves out; cargo
        # never compiles them for keyward. A member's missing include is still found there.
        bad = os.path.join(self.dir, "gate", "src", "missing_include.rs")
        with open(bad, "w", encoding="utf-8") as f:
            f.write('const X: &[u8] = include_bytes!("missing.bin");\n')
        problems, _ = check_image.check(self.dir)
        self.assertEqual(
            problems,
            [f"line {BUILD}: gate/src/missing_include.rs includes 'missing.bin', which is not in the stage (.dockerignore or a COPY left it out)"],
        )

    def edit_dockerfile(self, old, new):
        path = os.path.join(self.dir, "Dockerfile")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))

    def test_a_bin_that_does_not_exist_is_refused(self):
        self.edit_dockerfile("--bin keyward", "--bin keywrad")
        problems, _ = check_image.check(self.dir)
        self.assertEqual(len(problems), 1)
        self.assertTrue(problems[0].startswith(f"line {BUILD}: cargo auditable build --bin keywrad: no such binary in the workspace"), problems[0])

    def test_a_profile_that_does_not_exist_is_refused(self):
        self.edit_dockerfile("--profile dist", "--profile distribution")
        problems, _ = check_image.check(self.dir)
        self.assertEqual(
            problems,
            [f"line {BUILD}: cargo auditable build --profile distribution: no such profile in the workspace (bench, dev, dist, mutants, release, test)"],
        )


if __name__ == "__main__":
    unittest.main(verbosity=2)
