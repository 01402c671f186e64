# syntax=docker/dockerfile:1
#
# mountguard images: one Dockerfile, two final targets.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --target agent      -t ghcr.io/mountguard/mountguard-agent:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --target controller -t ghcr.io/mountguard/mountguard-controller:0.1.0 .
#
# The build stage always runs on the build machine's own platform
# ($BUILDPLATFORM) and cross-compiles static musl binaries for $TARGETARCH, so
# an arm64 image needs no emulation to build. scripts/test.sh runs the same
# cargo command for both targets in CI (see docs/images.md).

ARG RUST_VERSION=1.95
ARG DEBIAN_SUITE=bookworm

# ---------------------------------------------------------------- build
FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-slim-${DEBIAN_SUITE} AS build
ARG TARGETARCH
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools gcc-aarch64-linux-gnu file \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
WORKDIR /src
# The whole workspace (cargo --locked needs every member); see .dockerignore.
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY inventory inventory
COPY agent agent
COPY controller-shim controller-shim
COPY tests tests
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=mountguard-target-${TARGETARCH} \
    set -eu; \
    case "${TARGETARCH}" in \
      amd64) target=x86_64-unknown-linux-musl ;; \
      arm64) target=aarch64-unknown-linux-musl ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    cargo build --locked --release --target "${target}" \
      -p mountguard-agent -p mountguard-controller --bins; \
    mkdir -p /out; \
    for b in mountguard-agent mountguard-controller; do \
      cp "target/${target}/release/${b}" /out/; \
      file "/out/${b}" | grep -Eq 'statically linked|static-pie linked' \
        || { echo "/out/${b} is not static" >&2; exit 1; }; \
    done

# ---------------------------------------------------------------- common labels
FROM gcr.io/distroless/static-debian12:latest AS base
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.source="https://github.com/mountguard/mountguard" \
      org.opencontainers.image.url="https://github.com/mountguard/mountguard" \
      org.opencontainers.image.documentation="https://github.com/mountguard/mountguard/tree/main/docs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="mountguard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"

# ---------------------------------------------------------------- agent
# Runs as root with a single capability, DAC_READ_SEARCH, granted by the
# DaemonSet's securityContext (see docs/security.md): it reads volume files
# of any owner and mode. Without that capability, root here can read nothing
# it does not own.
FROM base AS agent
LABEL org.opencontainers.image.title="mountguard-agent" \
      org.opencontainers.image.description="mountguard node agent: hashes the Secret and ConfigMap content the kubelet serves on a node"
COPY --from=build /out/mountguard-agent /mountguard-agent
USER 0:0
ENTRYPOINT ["/mountguard-agent"]
CMD ["run"]

# ---------------------------------------------------------------- controller
FROM base AS controller
LABEL org.opencontainers.image.title="mountguard-controller" \
      org.opencontainers.image.description="mountguard controller: verdicts, metrics, Events and opt-in remediation"
COPY --from=build /out/mountguard-controller /mountguard-controller
USER 65532:65532
ENTRYPOINT ["/mountguard-controller"]
CMD ["run"]
