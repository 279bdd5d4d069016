# syntax=docker/dockerfile:1
# keyward: a static binary on a distroless base, running as non-root. No shell at run time.
#
#   docker build -t keyward:dev --build-arg VERSION=$(git describe --tags --always) .
#
# Needs BuildKit (the default builder since Docker 23; `docker buildx build` elsewhere).

ARG RUST_VERSION=1.95

# Built natively for each platform (buildx runs arm64 under QEMU): ring needs a C compiler
# for the target, and musl-tools provides the native one.
FROM rust:${RUST_VERSION}-bookworm AS build
ARG TARGETARCH
# `keyward version` and keyward_build_info name it (build.rs; .git is not in the context).
ARG VERSION=dev
ENV KEYWARD_BUILD_VERSION=${VERSION}
# musl-tools is a build-only tool from the pinned Debian release; nothing from apt ships.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-musl > /target ;; \
      arm64) echo aarch64-unknown-linux-musl > /target ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && rustup target add "$(cat /target)"
WORKDIR /src
# The whole workspace in one COPY: a hand-made dependency layer (manifests and stub sources)
# drifts from the workspace the moment a crate is added. BuildKit cache mounts keep the
# registry and the target directory between builds instead, per architecture (build scripts
# run on the build host). CI checks that every cargo command here sees a complete workspace
# (deploy/check_image.py).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,id=keyward-target-${TARGETARCH},sharing=locked \
    cargo build --release --locked --bin keyward --target "$(cat /target)" \
 && cp "target/$(cat /target)/release/keyward" /keyward

FROM gcr.io/distroless/static-debian12:nonroot
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
