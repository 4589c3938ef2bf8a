# The controller image: the operator (`sluiceway-operator`), the KEDA external scaler
# (`sluiceway-scaler`) and the capacity planner (`sluiceway`), on slim Python.
# Build from the repository root:  docker build -f images/controller.Dockerfile -t ghcr.io/sluiceway/sluiceway:0.1.0 .
# tests/chart/test_chart_images.py checks this file against pyproject.toml and charts/sluiceway.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY inference-pod/ inference-pod/
COPY operator/ operator/
COPY sandbox/ sandbox/
COPY gateway/ gateway/
# The `operator` extra: kopf, kubernetes, grpcio, protobuf. No torch.
RUN pip install ".[operator,gateway]" && rm -rf /src

WORKDIR /tmp
USER 65532:65532
# 8081: operator liveness; 9090: scaler gRPC; 9091: scaler /metrics.
EXPOSE 8081 9090 9091
ENTRYPOINT ["sluiceway-operator"]
CMD ["run"]
