# syntax=docker/dockerfile:1
# keyward: a static binary on a distroless base, running as non-root. No shell at run time.
#
#   docker build -t keyward:dev --build-arg VERSION=$(git describe --tags --always) .

ARG RUST_VERSION=1.95

# Built natively for each platform (buildx runs arm64 under QEMU): ring needs a C compiler
# for the target, and musl-tools provides the native one.
FROM rust:${RUST_VERSION}-bookworm AS build
ARG TARGETARCH
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
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY engine/Cargo.toml engine/Cargo.toml
COPY certs/Cargo.toml certs/Cargo.toml
RUN mkdir -p src engine/src engine/benches certs/src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch engine/src/lib.rs certs/src/lib.rs \
 && echo 'fn main() {}' > engine/benches/decide.rs \
 && echo 'fn main() {}' > benches/load.rs \
 && cargo fetch --locked
COPY . .
RUN cargo build --release --locked --bin keyward --target "$(cat /target)" \
 && cp "target/$(cat /target)/release/keyward" /keyward

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="keyward" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that injects control-plane credentials into operator pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/keyward/keyward" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /keyward /usr/local/bin/keyward
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/keyward"]
CMD ["serve", "--tls-dir=/var/run/keyward/tls", "--log-format=json"]
