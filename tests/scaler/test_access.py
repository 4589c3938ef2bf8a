"""The allow-list and the TLS-metadata rules, as pure functions (the gRPC tests are in test_security.py)."""

from __future__ import annotations

import pytest
from sluiceway_scaler.access import AllowList, Transport, check_transport, normalise_url
from sluiceway_scaler.errors import AddressNotAllowed, InvalidMetadata
from sluiceway_scaler.metadata import parse_metadata

GOOD = {"inferenceService": "demo", "targetQueueDepthPerReplica": "4"}
PLAIN = Transport(tls=False, client_cert=False)
TLS = Transport(tls=True, client_cert=False)
MTLS = Transport(tls=True, client_cert=True)


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("HTTP://Prometheus.Monitoring:9090/", "http://prometheus.monitoring:9090"),
        ("http://prometheus.monitoring", "http://prometheus.monitoring:80"),
        ("https://prometheus.monitoring/", "https://prometheus.monitoring:443"),
        ("http://prom:9090/prometheus/", "http://prom:9090/prometheus"),
        ("http://[::1]:9090", "http://[::1]:9090"),
        ("  http://127.0.0.1:9090  ", "http://127.0.0.1:9090"),
    ],
)
def test_normalise(given: str, normal: str) -> None:
    assert normalise_url(given) == normal


@pytest.mark.parametrize(
    "bad", ["prom:9090", "ftp://prom", "http://", "http://u:p@prom:9090", "http://prom:9090/?x=1", "http://prom:99999"]
)
def test_normalise_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        normalise_url(bad)


def cfg(**extra: str):  # type: ignore[no-untyped-def]
    return parse_metadata(GOOD | extra, "team-a")


def test_default_allows_nothing_not_even_loopback() -> None:
    for address in ("http://127.0.0.1:9090", "http://prometheus.monitoring:9090"):
        with pytest.raises(AddressNotAllowed) as e:
            AllowList().check(cfg(prometheusAddress=address))
        assert e.value.field == "prometheusAddress"
        assert "--allowed-prometheus" in e.value.message


def test_exact_base_url_after_normalising() -> None:
    allowed = AllowList.build(prometheus=["http://Prometheus.monitoring:9090/"])
    allowed.check(cfg(prometheusAddress="http://prometheus.monitoring:9090"))
    for other in (
        "http://prometheus.monitoring:9091",
        "https://prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/other",
        "http://prometheus.monitoring.evil:9090",
        "http://prometheus.monitoring:9090@evil:9090",
    ):
        with pytest.raises((AddressNotAllowed, InvalidMetadata)):
            allowed.check(cfg(prometheusAddress=other))


def test_pod_metrics_urls_need_their_own_allow_list() -> None:
    prom = "http://prometheus.monitoring:9090"
    allowed = AllowList.build(prometheus=[prom], pod_metrics=["http://10.0.0.5:9091/metrics"])
    allowed.check(cfg(prometheusAddress=prom, podMetricsUrls="http://10.0.0.5:9091/metrics"))
    with pytest.raises(AddressNotAllowed) as e:
        allowed.check(cfg(prometheusAddress=prom, podMetricsUrls="http://10.0.0.5:9091/metrics,http://10.0.0.6:9091/metrics"))
    assert e.value.field == "podMetricsUrls" and "10.0.0.6" in e.value.message
    with pytest.raises(AddressNotAllowed) as e:
        AllowList.build(prometheus=[prom]).check(cfg(prometheusAddress=prom, podMetricsUrls="http://10.0.0.5:9091/metrics"))
    assert "--allowed-pod-metrics" in e.value.message


def test_build_rejects_a_bad_flag_value() -> None:
    with pytest.raises(ValueError, match="--allowed-prometheus"):
        AllowList.build(prometheus=["prometheus:9090"])


@pytest.mark.parametrize(
    ("metadata", "transport", "field"),
    [
        ({"unsafeSsl": "true"}, TLS, "unsafeSsl"),
        ({"unsafeSsl": "yes please"}, TLS, "unsafeSsl"),
        ({"enableTLS": "true"}, PLAIN, "enableTLS"),
        ({"enableTLS": "maybe"}, TLS, "enableTLS"),
        ({"caCert": "/keda/ca.pem"}, PLAIN, "caCert"),
        ({"tlsClientCert": "/keda/tls.crt", "tlsClientKey": "/keda/tls.key"}, TLS, "tlsClientCert"),
        ({"tlsClientKey": "/keda/tls.key"}, MTLS, "tlsClientKey"),
        ({"tlsCertFile": "/keda/tls.crt"}, TLS, "tlsCertFile"),
    ],
)
def test_tls_keys_are_never_ignored(metadata: dict[str, str], transport: Transport, field: str) -> None:
    with pytest.raises(InvalidMetadata) as e:
        check_transport(metadata, transport)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("metadata", "transport"),
    [
        ({}, PLAIN),
        ({"unsafeSsl": "false", "enableTLS": "false"}, PLAIN),
        ({"enableTLS": "true"}, TLS),
        ({"caCert": "/keda/ca.pem", "unsafeSsl": "false"}, TLS),
        ({"caCert": "/keda/ca.pem", "tlsClientCert": "/keda/tls.crt", "tlsClientKey": "/keda/tls.key"}, MTLS),
    ],
)
def test_tls_keys_that_the_connection_honours(metadata: dict[str, str], transport: Transport) -> None:
    check_transport(metadata, transport)


def test_transport_from_grpc_auth_context() -> None:
    assert Transport.from_auth_context({"transport_security_type": [b"insecure"]}) == PLAIN
    assert Transport.from_auth_context({"transport_security_type": [b"ssl"]}) == TLS
    ssl_peer = {"transport_security_type": [b"ssl"], "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----"]}
    assert Transport.from_auth_context(ssl_peer) == MTLS
