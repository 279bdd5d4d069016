# syntax=docker/dockerfile:1
# keyward: one binary on a distroless base (glibc, no shell), running as non-root.
#
#   docker build -t keyward:dev --build-arg VERSION=$(git describe --tags --always) .
#
# Needs BuildKit (the default builder since Docker 23; `docker buildx build` elsewhere).

ARG RUST_VERSION=1.95

# Built on the build host's platform for every target (no QEMU: the arm64 image is
# cross-compiled, with Debian's aarch64 cross gcc for ring's C and the link) against the glibc
# of the Debian release the run stage's distroless base also ships (bookworm: 2.36). Not a
# static musl binary: musl's allocator made every admission cost 1.8-2.2x the CPU of the glibc
# build the benchmarks measure (BENCHMARKS.md, "The image's build"), and MALLOC_ARENA_MAX,
# which the controller's Deployment sets, is a glibc setting.
FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
# `keyward version` and keyward_build_info name it (build.rs; .git is not in the context).
ARG VERSION=dev
ENV KEYWARD_BUILD_VERSION=${VERSION}
# The image's SBOM lists the crates that ship: cargo-auditable writes the dependency tree into
# the binary (section .dep-v0), which BuildKit's scanner (Syft) reads in the final stage, where
# nothing else names them.
ARG CARGO_AUDITABLE_VERSION=0.7.7
RUN cargo install --locked --version "${CARGO_AUDITABLE_VERSION}" cargo-auditable
# The Rust target of TARGETARCH, and its cross toolchain when the host is another architecture.
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc \
    AR_x86_64_unknown_linux_gnu=x86_64-linux-gnu-ar
# DL3008: the cross packages follow the base image's Debian release; SC2086: ${cross} is two words.
# hadolint ignore=DL3008,SC2086
RUN case "${TARGETARCH}" in \
      amd64) target=x86_64-unknown-linux-gnu; cross="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
      arm64) target=aarch64-unknown-linux-gnu; cross="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
      *) echo "no Rust target for TARGETARCH=${TARGETARCH}" >&2; exit 1 ;; \
    esac \
 && echo "${target}" > /rust-target \
 && rustup target add "${target}" \
 && if [ "${TARGETARCH}" != "${BUILDARCH}" ]; then \
      apt-get update && apt-get install -y --no-install-recommends ${cross} && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
# The whole workspace in one COPY: a hand-made dependency layer (manifests and stub sources)
# drifts from the workspace the moment a crate is added. BuildKit cache mounts keep the
# registry and the target directory between builds instead. `dist` is the release profile with
# whole-program LTO (Cargo.toml; the build `make bench` measures). CI checks that every cargo
# command here sees a complete workspace and names a profile and binary that exist
# (deploy/check_image.py).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,id=keyward-target-${TARGETARCH},sharing=locked \
    cargo auditable build --profile dist --locked --bin keyward --target "$(cat /rust-target)" \
 && cp "target/$(cat /rust-target)/dist/keyward" /keyward

# distroless/cc: glibc and libgcc_s (what `ldd` lists for the binary), no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="keyward" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that injects control-plane credentials into operator pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/keyward/keyward" \
      org.opencontainers.image.licenses="Apache-2.0"
# Any UID runs it as well (OpenShift's restricted-v2 assigns one from the namespace's range,
# with group 0): the binary is root-owned and mode 0755, and keyward writes no file in a
# cluster (certificates and keys come from mounted Secrets).
COPY --from=build /keyward /usr/local/bin/keyward
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/keyward"]
CMD ["serve", "--tls-dir=/var/run/keyward/tls", "--log-format=json"]
