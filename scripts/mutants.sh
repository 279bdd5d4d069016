#!/usr/bin/env bash
# Mutation testing of the security-critical code (.cargo/mutants.toml), with cargo-mutants at
# the version pinned here, installed into target/ci-tools on first use. Used by `make mutants`.
#
#   scripts/mutants.sh                 # every file in .cargo/mutants.toml, and the owner and
#                                      # requester checks in context.rs and select.rs
#   scripts/mutants.sh -f FILE ...     # cargo-mutants' own filters, added to the scope file's
#   scripts/mutants.sh --ci            # .ci/run: only the lines the last commit changed in
#                                      # those files (nothing to do: no install, no build)
#
# Runs in a scratch copy of the tree (never mutating the working tree), results in
# target/mutants/; compare its missed.txt and timeout.txt with docs/mutants.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/mutants
if [[ "${1:-}" == "--ci" ]]; then
  mapfile -t files < <(sed -n 's/^ *"\([^"]*\.rs\)",$/\1/p' .cargo/mutants.toml)
  mkdir -p "$out"
  if ! git rev-parse -q --verify HEAD~1 >/dev/null || ! git diff --quiet HEAD~1 HEAD -- "${files[@]}"; then
    git diff HEAD~1 HEAD -- "${files[@]}" > "$out/last-commit.diff" 2>/dev/null || true
  else
    echo "mutants: the last commit changes none of the security-critical files; nothing to test"
    exit 0
  fi
  if [[ ! -s "$out/last-commit.diff" ]]; then
    echo "mutants: no previous commit to compare with; nothing to test"
    exit 0
  fi
fi
version=27.0.0
bin=target/ci-tools/bin
if [[ ! -x "$bin/cargo-mutants" ]] || [[ "$(PATH="$bin:$PATH" cargo mutants --version)" != "cargo-mutants $version" ]]; then
  cargo install --quiet --locked --version "$version" --root target/ci-tools cargo-mutants
fi
export PATH="$PWD/$bin:$PATH"
mkdir -p "$out"
if [[ "${1:-}" == "--ci" ]]; then
  # In place, reusing the build CI just made: only in a tree with nothing uncommitted, so that
  # a run cut short leaves its mutation visible to `git status` (and `git checkout .` undoes it).
  if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
    echo "mutants --ci: the tree has uncommitted changes; run it on a clean checkout" >&2
    exit 1
  fi
  # The crates' files, each mutant tested with its crate's tests: at most 20 (about half an
  # hour on 2 cores, with the install); a larger change is sampled, one shard of as many as it
  # takes. The binary's (src/): with the binary's unit tests, at most 10 (a build of the binary
  # each, about a minute).
  status=0
  count=$(cargo mutants --workspace --list --exclude 'src/**' --in-diff "$out/last-commit.diff" | wc -l)
  if (( count > 0 )); then
    shards=$(( (count + 19) / 20 ))
    echo "mutants: $count in the last commit's changes to the crates; testing $(( count < 20 ? count : 20 )) of them"
    cargo mutants --workspace --in-place --exclude 'src/**' --in-diff "$out/last-commit.diff" --shard "0/$shards" --output "$out/ci" || status=$?
  fi
  mapfile -t binary < <(printf '%s\n' "${files[@]}" | grep '^src/' | sed 's/^/-f\n/' )
  count=$(cargo mutants --no-config -p keyward "${binary[@]}" --list --in-diff "$out/last-commit.diff" | wc -l)
  if (( count > 0 )); then
    shards=$(( (count + 9) / 10 ))
    echo "mutants: $count in the last commit's changes to the binary's gate; testing $(( count < 10 ? count : 10 )) of them"
    cargo mutants --no-config -p keyward "${binary[@]}" --in-place --in-diff "$out/last-commit.diff" --shard "0/$shards" --output "$out/ci-binary" -- --bin keyward || status=$?
  fi
  exit "$status"
fi
if [[ $# -gt 0 ]]; then
  exec cargo mutants --workspace --output "$out" "$@"
fi
# The whole scope: one scratch copy of the tree (tracked and untracked files, as they are now;
# the working tree is never mutated), built without debug info (the `mutants` profile: linking
# is most of a mutant's build) for each package selection cargo-mutants builds, then each
# invocation tests two mutants at a time, each in a copy of that warm tree. Two at a time on 2 cores pays because the controller's fault
# tests spend most of their time waiting on Lease timers; cargo's jobserver keeps the builds to
# the machine's cores.
results="$PWD/$out"
tree="$results/tree"
rm -rf "$tree" "$out/files" "$out/owner" "$out/requester" "$out/summary.txt"
mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$tree"
cd "$tree"
# Warm for what cargo-mutants builds: the three mutated crates together (the baseline), then
# each alone (a mutant is built and tested with its own crate, whose features unify apart).
for packages in "-p keyward-certs -p keyward-engine -p keyward-controller" "-p keyward-certs" "-p keyward-engine" "-p keyward-controller" "-p keyward --bin keyward"; do
  # shellcheck disable=SC2086 # one word per argument
  cargo test --locked --profile mutants --no-run --quiet $packages
done
run=(cargo mutants --workspace --profile mutants --jobs 2 --copy-target=true)
status=0
"${run[@]}" --exclude 'src/**' --output "$results/files" || status=$?
# The gate's request path and TLS setup, in the binary (.cargo/mutants.toml): tested with the
# binary's unit tests only (its integration tests take minutes a mutant), and two functions of
# larger files, the TLS configuration and a connection's certificate deadline, alone.
mapfile -t binary < <(sed -n 's/^ *"\(src\/[^"]*\.rs\)",$/-f\n\1/p' .cargo/mutants.toml)
binary_run=(cargo mutants --no-config -p keyward --profile mutants --jobs 2 --copy-target=true --baseline=skip)
"${binary_run[@]}" "${binary[@]}" --output "$results/binary" -- --bin keyward || status=$?
"${binary_run[@]}" -f src/serve/mod.rs -F tls_config --output "$results/tls" -- --bin keyward || status=$?
"${binary_run[@]}" -f src/serve/connections.rs -F 'credential_until|close_when_answered|deadline' --output "$results/connection" -- --bin keyward || status=$?
# Only these functions of two larger files: the owner check before issuing, and who may
# create a profile's pods. (cargo-mutants 27's --re and --exclude-re do not filter its
# "delete field" mutants: a struct literal elsewhere in the file would come along.) The tree
# is the one whose baseline just passed, so it is not run again.
"${run[@]}" --no-config --baseline=skip --output "$results/owner" -f controller/src/context.rs -F owner_verified || status=$?
"${run[@]}" --no-config --baseline=skip --output "$results/requester" -f webhooks/src/select.rs -F requester_allowed || status=$?
cd "$results"
for part in files owner requester binary tls connection; do
  for kind in missed timeout; do
    if [[ -s "$part/mutants.out/$kind.txt" ]]; then sed "s/^/$kind: /" "$part/mutants.out/$kind.txt"; fi
  done
done > summary.txt
echo "mutants: every missed and timed-out mutant, to compare with docs/mutants.md's accepted list ($results/summary.txt):"
cat summary.txt
exit "$status"
