"""Fast unit tests of the storage initializer's pure parts (the real-store tests are
test_fetch_s3.py and test_fetch_http.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from sluiceway_pod.fetch import Credentials, FetchError, Target, load_credentials, parse_sha256, sigv4_headers

AWS_EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
MAY_24_2013 = dt.datetime(2013, 5, 24, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("query", "signature"),
    [  # the signatures of AWS's published SigV4 examples for S3 (GET ?lifecycle, GET ?max-keys=2&prefix=J)
        ({"lifecycle": ""}, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ({"max-keys": "2", "prefix": "J"}, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ],
)
def test_sigv4_matches_the_published_examples(query: dict[str, str], signature: str) -> None:
    h = sigv4_headers("GET", "examplebucket.s3.amazonaws.com", "/", query, AWS_EXAMPLE, "us-east-1", MAY_24_2013)
    assert h["authorization"].endswith(f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}")
    assert h["x-amz-date"] == "20130524T000000Z"


def test_digests_and_credentials_are_checked_and_scrubbed(tmp_path: object) -> None:
    assert parse_sha256(["AB" * 32, "sub/m.onnx=" + "cd" * 32]) == {"": "ab" * 32, "sub/m.onnx": "cd" * 32}
    with pytest.raises(FetchError, match="64 hex digits"):
        parse_sha256(["xyz"])
    assert load_credentials({}, None) is None
    with pytest.raises(FetchError, match="need both"):
        load_credentials({"AWS_ACCESS_KEY_ID": "a"}, None)
    c = load_credentials({"AWS_ACCESS_KEY_ID": "AKID1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}, None)
    assert c is not None and c.scrub("key AKID1 secret s3cr3t") == "key *** secret ***"
    t = Target("https", "user:pw@store:443", "/b/k?X-Amz-Signature=abc")
    assert t.shown() == "https://store:443/b/k"


def test_docs_models_md_lists_every_exit_code_and_flag() -> None:
    """docs/models.md's exit-code table and usage block stay what the command does."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from sluiceway_pod.fetch import EXIT_CODES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    table = {m[1]: int(m[0]) for m in re.findall(r"^\| (\d+) \| ([a-z-]+) \|", doc, re.M)}
    assert table == EXIT_CODES
    usage = doc.split("sluiceway-pod fetch --uri URI", 1)[1].split("```", 1)[0]
    helptext = subprocess.run(
        [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    flags = set(re.findall(r"--[a-z][a-z0-9-]+", usage)) | {"--uri", "--dest"}
    assert flags and all(f in helptext for f in flags), flags - {f for f in flags if f in helptext}
