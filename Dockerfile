# syntax=docker/dockerfile:1
# keyward: one binary on a distroless base (glibc, no shell), running as non-root.
#
#   docker build -t keyward:dev --build-arg VERSION=$(git describe --tags --always) .
#
# Needs BuildKit (the default builder since Docker 23; `docker buildx build` elsewhere).

ARG RUST_VERSION=1.95

# Built natively for each platform (buildx runs arm64 under QEMU) against the glibc of the
# Debian release the run stage's distroless base also ships (bookworm: 2.36). Not a static musl
# binary: musl's allocator made every admission cost 1.8-2.2x the CPU of the glibc build the
# benchmarks measure (BENCHMARKS.md, "The image's build"), and MALLOC_ARENA_MAX, which the
# controller's Deployment sets, is a glibc setting.
FROM rust:${RUST_VERSION}-bookworm AS build
# The cache mounts below are kept per architecture (build scripts run on the build host).
ARG TARGETARCH
# `keyward version` and keyward_build_info name it (build.rs; .git is not in the context).
ARG VERSION=dev
ENV KEYWARD_BUILD_VERSION=${VERSION}
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
    cargo build --profile dist --locked --bin keyward \
 && cp target/dist/keyward /keyward

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
