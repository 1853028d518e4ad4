# syntax=docker/dockerfile:1
# Both stages use the same base so the venv's interpreter symlinks resolve in the final one.
FROM python:3.11.14-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python -m venv /opt/kata-sizing
COPY requirements.lock pyproject.toml README.md ./
COPY operator/ operator/
# requirements.lock pins every runtime and operator dependency; as constraints it keeps
# them exact while the test-only pins in it are simply not installed.
RUN /opt/kata-sizing/bin/pip install --no-cache-dir \
        --constraint requirements.lock ".[operator]"

FROM python:3.11.14-slim-bookworm

LABEL org.opencontainers.image.title="kata-sizing" \
      org.opencontainers.image.description="Sizes Kata Containers RuntimeClasses from one KataSizingPolicy and keeps them in sync" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /opt/kata-sizing /opt/kata-sizing
COPY templates/ /opt/kata-sizing/templates/

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
