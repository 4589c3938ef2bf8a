# The inference pod image: `sluiceway-pod` on a CUDA build of torch.
# Build from the repository root:  docker build -f images/pod.Dockerfile -t ghcr.io/sluiceway/sluiceway-pod:0.1.0 .
# tests/chart/test_chart_images.py checks this file against pyproject.toml and what the operator renders
# (command, ports 8080 `http` and 9091 `metrics`, user 65532, config and key paths).
ARG TORCH_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${TORCH_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    TORCH_HOME=/tmp/torch \
    WEB_CONCURRENCY=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY inference-pod/ inference-pod/
COPY operator/ operator/
COPY sandbox/ sandbox/
COPY gateway/ gateway/
# The `pod` extra: torch (already in the base image, kept), FastAPI, uvicorn, orjson.
RUN pip install ".[pod]" && rm -rf /src

# The paths the operator mounts: config (ConfigMap), tenant key hashes (Secret), models (PVC),
# /tmp (emptyDir; the root file system is read-only).
RUN mkdir -p /etc/sluiceway /var/run/secrets/sluiceway /models && chown 65532:65532 /models
WORKDIR /tmp
USER 65532:65532
# 8080: inference (HTTP, Open Inference Protocol v2); 9091: /metrics (Prometheus only).
EXPOSE 8080 9091
# One process, one uvicorn worker (the admission queue and the GPU permits live in it).
ENTRYPOINT ["sluiceway-pod"]
CMD ["serve", "--config", "/etc/sluiceway/config.yaml", "--termination-log", "/dev/termination-log"]
