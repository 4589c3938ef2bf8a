"""Docs that are true: (a) every repository path, test name and ``sluiceway_*`` module that the
documents name exists; (b) every ``curl`` in the documents and samples runs against a real pod.

(a) Sources: ``README.md``, ``docs/*.md``, every file of ``crds/``, ``charts/``, ``images/`` and
``samples/``, and the docstrings and comments of the Python files and the comments of the shell
scripts. A reference is a path starting with a top-level directory of the repository or a package
(``tests/chart/test_chart_static.py``, ``sluiceway_pod/models.py``, with an optional
``::test_name``), a bare test file name (``test_operator_render.py``: some file of that name under
``tests/``), a relative Markdown link, or a dotted module name (``sluiceway_sandbox.services``, and
one attribute after it). Paths that git ignores are outputs (``bench/results/...``), not files of
the repository; ``core/v1`` is Kubernetes' API group, not a path.

(b) A ``curl`` in a sample runs against a real ``sluiceway-pod`` process configured from that
sample's InferenceService exactly as the operator renders it (``build_pod_config``); a ``curl`` in a
document runs against the pod of ``samples/demo-cpu.yaml``. In-cluster host names
(``<svc>.<ns>.svc[.cluster.local]``) are cluster commands: the path and method must be a route of
the pod's ``/openapi.json``, and the command then runs with the host rewritten to the pod on
loopback (port 8080 to the inference port, 9091 to the metrics port). It must answer 2xx.

Items wrong today in files this test's author does not own are listed in ``KNOWN_WRONG_PATHS`` /
``KNOWN_WRONG_CURLS`` and marked ``xfail(strict=True)``: each turns red once its document is fixed,
so the list is emptied as the fixes land. Runs in one thread; the pods are subprocesses.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import subprocess
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from podtools import PodProcess, start_pod

ROOT = Path(__file__).resolve().parents[1]

#: (file, reference) named wrongly today, with the fix (files owned by others: the lead applies them)
KNOWN_WRONG_PATHS: dict[tuple[str, str], str] = {
}

#: (file, first line of the curl) wrong today, with the fix
KNOWN_WRONG_CURLS: dict[tuple[str, int], str] = {
}

NOT_PATHS = frozenset({"core/v1"})  # Kubernetes' core API group/version


@cache
def _git_files() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(out.split())


@cache
def _packages() -> dict[str, Path]:
    return {p.name: p for p in sorted(ROOT.glob("*/sluiceway_*")) if (p / "__init__.py").is_file()}


@cache
def _path_re() -> re.Pattern[str]:
    tops = sorted({f.split("/")[0] for f in _git_files() if "/" in f} | set(_packages()))
    alt = "|".join(re.escape(t) for t in tops)
    return re.compile(rf"(?<![\w./~$-])((?:{alt})/[\w./*-]*[\w*])(::[\w*]+)?")


BARE_TEST_RE = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")
DOTTED_RE = re.compile(r"(?<![\w./-])(sluiceway_[a-z]+(?:\.[A-Za-z_]\w*)+)")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _python_prose(text: str) -> str:
    """Docstrings (module, classes, functions) and comments of a Python file."""
    parts: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    parts += [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return "\n".join(parts)


def doc_sources() -> Iterator[tuple[str, str]]:
    """(repository path, text to check) of every document, sample, chart file and file header."""
    yield "README.md", (ROOT / "README.md").read_text()
    for p in sorted((ROOT / "docs").glob("*.md")):
        yield str(p.relative_to(ROOT)), p.read_text()
    for f in _git_files():
        path = ROOT / f
        if not path.is_file():
            continue
        if f.startswith(("crds/", "charts/", "images/", "samples/")) and not f.endswith((".png", ".tgz")):
            yield f, path.read_text(errors="replace")
        elif f.endswith(".py"):
            yield f, _python_prose(path.read_text())
        elif f.endswith(".sh"):
            yield f, "\n".join(line for line in path.read_text().splitlines() if line.lstrip().startswith("#"))


def _ignored(ref: str) -> bool:
    """Ignored by git, as a file or as a folder: a pattern ending in ``/`` (``/bench/results/``) matches
    only a folder, and in a fresh clone, where the folder does not exist yet, only the spelling with
    the slash tells git it is one."""
    return any(
        subprocess.run(["git", "check-ignore", "-q", "--no-index", r], cwd=ROOT, check=False).returncode == 0
        for r in (ref, ref.rstrip("/") + "/")
    )


def path_exists(ref: str, test: str | None = None) -> bool:
    """Whether the repository path (or package-relative path, glob allowed) exists; with ``test``
    (``::name``), whether that file defines it."""
    head = ref.split("/")[0]
    base = _packages()[head].parent if head in _packages() else ROOT
    if "*" in ref:
        return any(base.glob(ref))
    p = base / ref
    if not p.exists():
        return False
    if test:
        name = re.escape(test).replace(r"\*", r"\w*")
        return p.is_file() and re.search(rf"(?m)^\s*(?:async\s+)?def\s+{name}\b", p.read_text()) is not None
    return True


def dotted_exists(ref: str) -> bool:
    """``<package>.<module>[.<sub>][.<name>]``: the module exists and defines or imports ``name``."""
    parts = ref.split(".")
    cur = _packages().get(parts[0])
    if cur is None:
        return False
    i = 1
    while i < len(parts):
        if (cur / parts[i]).is_dir():
            cur, i = cur / parts[i], i + 1
        elif (cur / f"{parts[i]}.py").is_file():
            cur, i = cur / f"{parts[i]}.py", i + 1
            break
        else:
            break
    if i == len(parts):
        return True
    mod = cur if cur.suffix == ".py" else cur / "__init__.py"
    name = re.escape(parts[i])
    pattern = rf"(?m)^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b"
    return mod.is_file() and re.search(pattern, mod.read_text()) is not None


def references(source: str, text: str) -> Iterator[tuple[str, bool]]:
    """(reference as written, whether it exists) for every reference in ``text`` of file ``source``."""
    test_names = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    for m in _path_re().finditer(text):
        ref = m.group(1).rstrip(".")
        ok = path_exists(ref, (m.group(2) or "")[2:] or None)
        if ref in NOT_PATHS or (not ok and _ignored(ref)):
            continue
        yield ref + (m.group(2) or ""), ok
    for m in BARE_TEST_RE.finditer(text):
        yield m.group(1), m.group(1) in test_names
    for m in DOTTED_RE.finditer(text):
        yield m.group(1), dotted_exists(m.group(1))
    if source.endswith(".md"):
        for m in LINK_RE.finditer(text):
            link = m.group(1)
            if "://" in link or link.startswith("mailto:"):
                continue
            yield link, ((ROOT / source).parent / link).exists()


@cache
def all_references() -> tuple[tuple[str, str, bool], ...]:
    return tuple((src, ref, ok) for src, text in doc_sources() for ref, ok in references(src, text))


def test_the_reference_finder_finds_and_judges() -> None:
    text = (
        "see `tests/chart/test_chart_static.py::test_chart_crds_are_byte_identical_copies`, "
        "tests/chart/nope.py, ``sluiceway_pod/models.py``, test_operator_render.py, test_nope.py, "
        "sluiceway_sandbox.services, sluiceway_sandbox.layout.Layout, sluiceway_sandbox.layout.Nope, "
        "tests/chart/test_chart_static.py::test_nope, tests/chart/test_chart_static.py::test_chart_crds_*, "
        "core/v1, bench/results/x.json."
    )
    got = dict(references("x.py", text))
    assert got == {
        "tests/chart/test_chart_static.py::test_chart_crds_are_byte_identical_copies": True,
        "tests/chart/nope.py": False,
        "sluiceway_pod/models.py": True,
        "test_operator_render.py": True,
        "test_nope.py": False,
        "sluiceway_sandbox.services": True,
        "sluiceway_sandbox.layout.Layout": True,
        "sluiceway_sandbox.layout.Nope": False,
        "tests/chart/test_chart_static.py::test_nope": False,
        "tests/chart/test_chart_static.py::test_chart_crds_*": True,
    }
    assert dict(references("docs/x.md", "[a](img/none.png) [b](https://x.io/a) [c](sandbox.md#teardown)")) == {
        "img/none.png": False,
        "sandbox.md": True,
    }


def test_every_path_named_in_docs_and_headers_exists() -> None:
    refs = all_references()
    missing = sorted({(src, ref) for src, ref, ok in refs if not ok} - set(KNOWN_WRONG_PATHS))
    print(f"{len(refs)} references checked in {len({s for s, _, _ in refs})} files; missing: {len(missing)}")
    assert len(refs) > 300, "the finder stopped finding references"
    assert not missing, "\n".join(f"{src}: {ref}" for src, ref in missing)


@pytest.mark.parametrize(
    ("source", "ref"),
    [pytest.param(s, r, marks=pytest.mark.xfail(strict=True, reason=fix)) for (s, r), fix in KNOWN_WRONG_PATHS.items()],
)
def test_known_wrong_path_is_fixed(source: str, ref: str) -> None:
    assert (source, ref, False) not in all_references(), f"{source} still names {ref}, which does not exist"


# --- (b) curl ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curl:
    source: str
    line: int
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def _curl_lines(source: str, text: str) -> Iterator[tuple[int, str]]:
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        body = raw.lstrip().lstrip("#").strip() if source.endswith((".yaml", ".yml", ".sh")) else raw.strip()
        # a command: at the start of a (comment) line, in inline code, or after a shell prompt; the
        # word in prose ("every curl in the docs") is not one
        m = re.search(r"(?:^|`|\$ )(curl\s.*)", body)
        if not m:
            i += 1
            continue
        start, cmd = i + 1, m.group(1).rstrip("`")
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = lines[i].lstrip().lstrip("#").strip() if source.endswith((".yaml", ".yml")) else lines[i].strip()
            cmd = cmd[:-1] + " " + nxt
        yield start, cmd
        i += 1


def curls() -> list[Curl]:
    out = []
    for src in ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))]:
        out += [Curl(src, n, tuple(shlex.split(c))) for n, c in _curl_lines(src, (ROOT / src).read_text())]
    for p in sorted((ROOT / "samples").glob("*.yaml")):
        src = str(p.relative_to(ROOT))
        out += [Curl(src, n, tuple(shlex.split(c))) for n, c in _curl_lines(src, p.read_text())]
    return out


def _sample_pod_config(sample: Path) -> dict[str, Any]:
    """The pod config the operator renders for the sample's InferenceService, listening where the
    test harness says (host, ports and the key file are the harness's)."""
    from sluiceway_operator.render import Owner, build_pod_config
    from sluiceway_operator.spec import parse_spec

    (isvc,) = [d for d in yaml.safe_load_all(sample.read_text()) if d and d.get("kind") == "InferenceService"]
    meta = isvc["metadata"]
    cfg: dict[str, Any] = yaml.safe_load(
        build_pod_config(
            Owner(meta["name"], meta.get("namespace", "default"), "uid"), parse_spec(isvc["spec"])
        ).to_yaml()
    )
    for key in ("host", "port", "metricsPort"):
        cfg.get("server", {}).pop(key, None)
    return cfg


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], PodProcess]]:
    started: dict[str, PodProcess] = {}

    def pod_for(source: str) -> PodProcess:
        sample = source if source.startswith("samples/") else "samples/demo-cpu.yaml"
        if sample not in started:
            started[sample] = start_pod(tmp_path_factory.mktemp("docs-pod"), config=_sample_pod_config(ROOT / sample))
        return started[sample]

    yield pod_for
    for pod in started.values():
        pod.terminate(30)


def _routes(pod: PodProcess) -> list[tuple[str, re.Pattern[str]]]:
    doc = json.loads(
        subprocess.run(
            ["curl", "-sf", f"{pod.admin_url}/openapi.json"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    )
    out = []
    for path, ops in doc["paths"].items():
        rx = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")
        out += [(method.upper(), rx) for method in ops]
    return out


def _method(argv: tuple[str, ...]) -> str:
    for i, a in enumerate(argv):
        if a in ("-X", "--request") and i + 1 < len(argv):
            return argv[i + 1].upper()
    return "POST" if any(a in ("-d", "--data", "--data-binary", "--data-raw", "--json") for a in argv) else "GET"


def _rewrite(url: str, pod: PodProcess) -> tuple[str, bool]:
    """(URL on the pod, whether the command is a cluster command)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    cluster = host.endswith((".svc", ".svc.cluster.local"))
    assert cluster or host in ("localhost", "127.0.0.1"), f"curl to {host}: neither loopback nor in-cluster"
    port = pod.metrics_port if parts.port == 9091 else pod.port
    return urlunsplit(("http", f"127.0.0.1:{port}", parts.path, parts.query, "")), cluster


ALL_CURLS = curls()


def test_the_curls_are_found() -> None:
    assert any(c.source == "samples/demo-cpu.yaml" for c in ALL_CURLS), [c.id for c in ALL_CURLS]


@pytest.mark.parametrize(
    "curl",
    [
        pytest.param(
            c,
            id=c.id,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_WRONG_CURLS[(c.source, c.line)])]
            if (c.source, c.line) in KNOWN_WRONG_CURLS
            else [],
        )
        for c in ALL_CURLS
    ],
)
def test_every_curl_in_docs_and_samples_runs(curl: Curl, pods: Callable[[str], PodProcess]) -> None:
    pod = pods(curl.source)
    urls = [i for i, a in enumerate(curl.argv) if re.match(r"^(https?://)?[\w.-]+(:\d+)?/", a)]
    assert len(urls) == 1, f"{curl.id}: one URL expected in {curl.argv}"
    argv = list(curl.argv)
    new_url, cluster = _rewrite(argv[urls[0]], pod)
    argv[urls[0]] = new_url
    if cluster:
        method, path = _method(curl.argv), urlsplit(new_url).path
        assert any(m == method and rx.match(path) for m, rx in _routes(pod)), f"{curl.id}: {method} {path} not a route"
    res = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=60, check=False)
    body, _, code = res.stdout.rpartition("\n")
    print(f"{curl.id}: HTTP {code} {body[:300]}")
    assert res.returncode == 0, res.stderr
    assert code.startswith("2"), f"{curl.id}: HTTP {code}: {body[:500]}"


def test_the_fuzz_count_in_docs_is_the_tests() -> None:
    doc = re.search(
        r"`test_operator_fuzz\.py`[^:]*: (\d+) hypothesis-generated", (ROOT / "docs/operator.md").read_text()
    )
    code = re.search(r"(?m)^EXAMPLES = (\d+)", (ROOT / "tests/operator/test_operator_fuzz.py").read_text())
    assert doc is not None and code is not None, "the sentence or the constant moved: update this test"
    assert doc.group(1) == code.group(1), f"docs/operator.md says {doc.group(1)}, the test runs {code.group(1)}"
