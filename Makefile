# Everyday commands. `make help` lists them.
.PHONY: help run explain bench manifests deploy-check image-check image deny e2e test fmt lint check-profiles ci

help: ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

run: ## keyward serve on the embedded default (a dev CA in .keyward-dev/)
	cargo run -- serve

explain: ## explain what keyward does to an LMEvalJob driver pod
	cargo run -- explain tests/fixtures/lmeval-fms-driver-pod.json

test: ## the whole test suite (what CI runs, with fmt and clippy)
	cargo test --workspace --locked

bench: ## the benchmarks behind BENCHMARKS.md
	scripts/bench.sh

fmt: ## format the code
	cargo fmt --all

lint: ## clippy, warnings as errors
	cargo clippy --workspace --all-targets --locked -- -D warnings

manifests: ## regenerate deploy/base/webhook.yaml from the profiles
	cargo run -q -- manifests webhook > deploy/base/webhook.yaml

deploy-check: ## render every overlay and validate it strictly (as CI does)
	for o in deploy/overlays/*/; do kubectl kustomize $$o | target/ci-venv/bin/python deploy/validate.py - || exit 1; done

image-check: ## check the Dockerfile's build stage against the workspace, without Docker (as CI does)
	target/ci-venv/bin/python deploy/check_image.py

image: ## build the image keyward:dev (needs Docker with BuildKit)
	docker build -t keyward:dev --build-arg VERSION=$$(git describe --tags --always --dirty) .

deny: ## licenses, duplicate crates and sources (deny.toml), as CI checks them
	target/ci-tools/bin/cargo-deny check licenses bans sources

e2e: ## kind + cert-manager + keyward end to end (needs docker and kind)
	deploy/e2e/kind.sh

check-profiles: ## validate the built-in profiles
	cargo run -- check-profiles

ci: ## exactly what CI runs
	bash .ci/run
