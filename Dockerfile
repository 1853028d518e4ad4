# syntax=docker/dockerfile:1
# The published base, pinned by tag (readable) and by the digest of its multi-architecture
# index (reproducible; the tag moves with every Debian update). To move it: `docker buildx
# imagetools inspect python:3.11.14-slim-bookworm` and replace both defaults.
# Both stages must have the same Python at the same path so the venv's interpreter symlinks
# resolve in the final one. `make image` builds without a registry by passing local bases from
# Debian's packages: BUILDER_BASE with python3-venv, BASE without it (docs/image.md).
ARG BUILDER_BASE=docker.io/library/python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
ARG BASE=docker.io/library/python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
# Any Go from 1.19 builds the probe's init (operator/probe-init: the standard library only):
# by default the same pinned base with Debian bookworm's golang-go (1.19); `make image` passes a
# local base that has golang-go already.
ARG GO_BUILDER=docker.io/library/python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${GO_BUILDER} AS probe-init
RUN command -v go >/dev/null || (apt-get update \
        && apt-get install --yes --no-install-recommends golang-go=2:1.19~1 \
        && rm -rf /var/lib/apt/lists/*)
WORKDIR /src
COPY operator/probe-init/ ./
# A static binary: it is the init of the VMs `kata-sizing probe` boots (docs/probe.md).
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /probe-init .

FROM ${BUILDER_BASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python3 -m venv /opt/kata-sizing
COPY requirements.lock pyproject.toml README.md ./
COPY operator/ operator/
# requirements.lock pins every runtime and operator dependency; as constraints it keeps
# them exact while the test-only pins in it are simply not installed. Then pip and
# setuptools leave the venv: nothing in the image installs anything at run time.
# The container runs with a read-only root and PYTHONDONTWRITEBYTECODE, so bytecode missing
# from the image would be compiled again at every start: compile the whole venv here.
RUN /opt/kata-sizing/bin/pip install --no-cache-dir \
        --constraint requirements.lock ".[operator]" \
    && /opt/kata-sizing/bin/python -m pip uninstall --yes pip setuptools \
    && /opt/kata-sizing/bin/python -m compileall -q -j 0 /opt/kata-sizing

FROM ${BASE}

# Set by the build: docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD)
# (VERSION's default is pyproject.toml's version; a test keeps them equal).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG BASE

LABEL org.opencontainers.image.title="kata-sizing" \
      org.opencontainers.image.description="Sizes Kata Containers RuntimeClasses from one KataSizingPolicy and keeps them in sync" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kata-sizing/kata-sizing" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE}"

# No package installer in the final image: the base's pip, and the pip and setuptools wheels
# that ensurepip (python:slim) or python3-venv (Debian) bundle for `python -m venv`.
# The published python image ships its standard library without bytecode (docker-library/python
# deletes every .pyc under /usr/local): compile it, since nothing can be written at run time.
RUN rm -rf /usr/local/bin/pip /usr/local/bin/pip3 /usr/local/bin/pip3.11 \
        /usr/local/lib/python3.11/site-packages/pip \
        /usr/local/lib/python3.11/site-packages/pip-*.dist-info \
        /usr/local/lib/python3.11/ensurepip/_bundled \
        /usr/lib/python3.11/ensurepip/_bundled \
        /usr/share/python-wheels \
    && python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"

COPY --from=builder /opt/kata-sizing /opt/kata-sizing
COPY templates/ /opt/kata-sizing/templates/
COPY --from=probe-init /probe-init /usr/lib/kata-sizing/probe-init

# HOME=/tmp: UID 65532 has no passwd entry and /tmp is the only writable mount in the
# Deployment (read-only root filesystem).
ENV PATH=/opt/kata-sizing/bin:$PATH \
    KATA_SIZING_TEMPLATES=/opt/kata-sizing/templates \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

# Matches runAsUser in manifests/deployment.yaml; numeric so runAsNonRoot can verify it.
USER 65532:65532

ENTRYPOINT ["kata-sizing"]
CMD ["operator", "--standalone"]
