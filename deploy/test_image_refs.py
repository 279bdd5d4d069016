#!/usr/bin/env python3
"""Tests of deploy/image_refs.py: what it accepts and refuses, and that a pinned install passes
the release check (run by .ci/run)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import image_refs  # noqa: E402

DIGEST = "sha256:" + "ab" * 32


def deployment(image, name="keyward"):
    return f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  template:
    spec:
      initContainers: [{{name: init, image: "{image}"}}]
      containers: [{{name: main, image: "{image}"}}]
"""


class Check(unittest.TestCase):
    def test_the_placeholder_passes_until_release(self):
        text = deployment(image_refs.PLACEHOLDER)
        self.assertEqual(image_refs.problems(text, "f", release=False), [])
        found = image_refs.problems(text, "f", release=True)
        self.assertEqual(len(found), 2)
        self.assertIn("f: Deployment/keyward container 'init': still the placeholder", found[0])

    def test_a_digest_passes_and_a_tag_does_not(self):
        self.assertEqual(image_refs.problems(deployment(f"ghcr.io/o/keyward@{DIGEST}"), "f", True), [])
        self.assertEqual(image_refs.problems(deployment(f"registry:5000/o/keyward:v1@{DIGEST}"), "f", True), [])
        found = image_refs.problems(deployment("ghcr.io/keyward/keyward:0.1.0"), "f", False)
        self.assertIn("ghcr.io/keyward/keyward:0.1.0: a tag can change under an install", found[0])
        found = image_refs.problems(deployment("ghcr.io/o/keyward@sha256:abc"), "f", False)
        self.assertIn("the digest is not sha256:<64 lower-case hex>", found[0])
        found = image_refs.problems(deployment(f"GHCR.io/O/Keyward@{DIGEST}"), "f", False)
        self.assertIn("not a registry path", found[0])

    def test_a_cronjob_is_searched_too_and_nothing_to_check_is_a_problem(self):
        cronjob = """kind: CronJob
metadata: {name: audit}
spec: {jobTemplate: {spec: {template: {spec: {containers: [{name: a, image: keyward}]}}}}}
"""
        self.assertIn("CronJob/audit container 'a': keyward: a tag", image_refs.problems(cronjob, "f", False)[0])
        self.assertEqual(
            image_refs.problems("kind: ConfigMap\n", "f", False), ["f: no containers: is this a rendered install?"]
        )


class Pin(unittest.TestCase):
    def test_pinned_passes_the_release_check(self):
        pinned = image_refs.pin(deployment(image_refs.PLACEHOLDER), "ghcr.io/owner/keyward", DIGEST)
        self.assertIn(f"ghcr.io/owner/keyward@{DIGEST}", pinned)
        self.assertEqual(image_refs.problems(pinned, "f", release=True), [])

    def test_bad_input_is_refused(self):
        text = deployment(image_refs.PLACEHOLDER)
        with self.assertRaisesRegex(ValueError, "--digest 'sha256:12': not sha256"):
            image_refs.pin(text, "ghcr.io/owner/keyward", "sha256:12")
        with self.assertRaisesRegex(ValueError, "not a registry path in lower case"):
            image_refs.pin(text, "ghcr.io/Owner/keyward:v1", DIGEST)
        with self.assertRaisesRegex(ValueError, "nothing to pin"):
            image_refs.pin(deployment("x"), "ghcr.io/owner/keyward", DIGEST)


if __name__ == "__main__":
    unittest.main()
