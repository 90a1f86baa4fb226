"""--web-config: TLS, client certificates, basic auth and headers, against real peers.

Certificates come from a throwaway CA made with `cryptography`; the agent runs as a real
subprocess behind the file, clients are urllib with real TLS contexts, and a real
Prometheus server scrapes it over TLS with basic auth.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import ssl
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from agent import AgentProcess, parse_metrics, pick, run_cli
from conftest import need_tool
from waiting import PATIENCE, wait_until

bcrypt = pytest.importorskip("bcrypt", reason="basic auth checks bcrypt hashes")
x509 = pytest.importorskip("cryptography.x509", reason="the tests make their certificates with cryptography")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

from exporter.web.auth import BasicAuthenticator  # noqa: E402
from exporter.web.watcher import WebConfigWatcher, load_web_config  # noqa: E402
from exporter.web.webconfig import parse_web_config  # noqa: E402

SIM = ("--backend", "simulated", "--interval", "250ms")


# ---------------------------------------------------------------- certificates


@dataclass
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path
    other_client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def _issue(ca_key, ca_name, cn: str, sans: list, usage, path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("l9gpu test CA")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server = _issue(ca_key, ca_name, "l9gpu", [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                    ExtendedKeyUsageOID.SERVER_AUTH, directory / "server.crt")
    client = _issue(ca_key, ca_name, "prometheus", [x509.DNSName("prometheus.monitoring")],
                    ExtendedKeyUsageOID.CLIENT_AUTH, directory / "client.crt")
    other = _issue(ca_key, ca_name, "someone", [x509.DNSName("someone.else")],
                   ExtendedKeyUsageOID.CLIENT_AUTH, directory / "other.crt")
    return Pki(directory, directory / "ca.crt", directory / "server.crt", _write_key(server, directory / "server.key"),
               directory / "client.crt", _write_key(client, directory / "client.key"),
               directory / "other.crt", _write_key(other, directory / "other.key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def htpasswd_hash(password: str) -> str:
    """A bcrypt hash as htpasswd -B writes it ($2y$); cost 5 keeps the tests quick."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(5)).decode().replace("$2b$", "$2y$", 1)


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def write_config(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def start_agent(tmp_path: Path, config: Path, *, scheme: str = "https", ctx: ssl.SSLContext | None = None,
                via_env: bool = False) -> AgentProcess:
    args = list(SIM) + ([] if via_env else ["--web-config", str(config)])
    env = {"L9GPU_WEB_CONFIG": str(config)} if via_env else None
    agent = AgentProcess(args, env=env, log_path=tmp_path / f"agent-{time.monotonic_ns()}.log",
                         scheme=scheme, ssl_context=ctx)
    try:
        agent.start()
    except BaseException:
        agent.stop()  # one that never got ready must not outlive the test
        raise
    return agent


@pytest.fixture
def agents():
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()


# ---------------------------------------------------------------- the pure loader


def test_empty_file_is_plain_http_without_auth():
    config = parse_web_config(None, "/etc/l9gpu/web.yml")
    assert config.tls is None and not config.users and config.headers == () and config.rate_limit is None


def test_full_file_parses_and_relative_paths_follow_the_file():
    config = parse_web_config({
        "tls_server_config": {"cert_file": "server.crt", "key_file": "/abs/server.key",
                              "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
                              "client_allowed_sans": ["prometheus.monitoring"],
                              "min_version": "TLS13", "max_version": "TLS13",
                              "cipher_suites": ["TLS_AES_128_GCM_SHA256"], "prefer_server_cipher_suites": False},
        "http_server_config": {"http2": False, "headers": {"X-Frame-Options": "deny", "X-XSS-Protection": ""}},
        "basic_auth_users": {"alice": "$2y$10$" + "a" * 53, 1234: "$2b$04$" + "B" * 53},
        "rate_limit": {"interval": "100ms", "burst": 5},
    }, "/etc/l9gpu/web.yml")
    tls = config.tls
    assert tls is not None
    assert tls.cert_file == "/etc/l9gpu/server.crt" and tls.key_file == "/abs/server.key"
    assert tls.client_ca_file == "/etc/l9gpu/ca.crt"
    assert tls.verify_mode == ssl.CERT_REQUIRED
    assert tls.client_allowed_sans == ("prometheus.monitoring",)
    assert (tls.min_version, tls.max_version) == ("TLS13", "TLS13")
    assert config.headers == (("X-Frame-Options", "deny"),)  # blank means unset
    assert set(config.users) == {"alice", "1234"} and config.http2 is False
    assert config.rate_limit is not None and config.rate_limit.interval == pytest.approx(0.1)
    assert config.files() == ("/etc/l9gpu/web.yml", "/etc/l9gpu/server.crt", "/abs/server.key", "/etc/l9gpu/ca.crt")


def test_tls_section_without_certificate_settings_is_plain_http():
    assert parse_web_config({"tls_server_config": {"min_version": "TLS13"}}, "w.yml").tls is None


@pytest.mark.parametrize("verify", [("NoClientCert", ssl.CERT_NONE), ("RequestClientCert", ssl.CERT_NONE),
                                    ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
                                    ("RequireAnyClientCert", ssl.CERT_REQUIRED),
                                    ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED)])
def test_client_auth_types_map_to_verify_modes(verify):
    name, mode = verify
    tls = {"cert_file": "s.crt", "key_file": "s.key", "client_auth_type": name}
    if mode != ssl.CERT_NONE:
        tls["client_ca_file"] = "ca.crt"
    config = parse_web_config({"tls_server_config": tls}, "w.yml")
    assert config.tls is not None and config.tls.verify_mode == mode


TLS_OK = {"cert_file": "s.crt", "key_file": "s.key"}
BAD_CONFIGS = {
    "unknown top-level key": ({"basic_auth_user": {}}, "basic_auth_user: unknown key"),
    "not a mapping": (["tls_server_config"], "must be a mapping"),
    "unknown tls key": ({"tls_server_config": {**TLS_OK, "certfile": "x"}}, "tls_server_config.certfile: unknown key"),
    "key without certificate": ({"tls_server_config": {"key_file": "s.key"}}, "tls_server_config.cert_file: missing"),
    "certificate without key": ({"tls_server_config": {"cert_file": "s.crt"}}, "tls_server_config.key_file: missing"),
    "inline and file": ({"tls_server_config": {**TLS_OK, "cert": "PEM"}}, "tls_server_config.cert_file: give either"),
    "bad client auth type": ({"tls_server_config": {**TLS_OK, "client_auth_type": "RequireClientCert"}},
                             "tls_server_config.client_auth_type: 'RequireClientCert' is not one of"),
    "verify without CA": ({"tls_server_config": {**TLS_OK, "client_auth_type": "RequireAndVerifyClientCert"}},
                          "tls_server_config.client_ca_file: missing"),
    "CA without client auth": ({"tls_server_config": {**TLS_OK, "client_ca_file": "ca.crt"}},
                               "tls_server_config.client_ca_file: a client CA is set"),
    "SANs without required certificate": (
        {"tls_server_config": {**TLS_OK, "client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": "ca.crt",
                               "client_allowed_sans": ["x"]}}, "tls_server_config.client_allowed_sans: needs"),
    "bad min version": ({"tls_server_config": {**TLS_OK, "min_version": "TLS14"}}, "tls_server_config.min_version"),
    "min above max": ({"tls_server_config": {**TLS_OK, "min_version": "TLS13", "max_version": "TLS12"}},
                      "tls_server_config.min_version: TLS13 is above"),
    "cipher suites not a list": ({"tls_server_config": {**TLS_OK, "cipher_suites": "AES"}},
                                 "tls_server_config.cipher_suites: must be a list"),
    "plain password": ({"basic_auth_users": {"alice": "hunter2"}}, "basic_auth_users.alice: not a bcrypt hash"),
    "md5 htpasswd hash": ({"basic_auth_users": {"bob": "$apr1$abcdefgh$0123456789abcdefghijkl"}},
                          "basic_auth_users.bob: not a bcrypt hash"),
    "reserved header": ({"http_server_config": {"headers": {"Content-Type": "text/html"}}},
                        "http_server_config.headers.Content-Type: this header is set by the server"),
    "bad X-Frame-Options": ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
                            "http_server_config.headers.X-Frame-Options: 'allow' is not one of"),
    "header line break": ({"http_server_config": {"headers": {"X-A": "a\r\nSet-Cookie: x"}}},
                          "http_server_config.headers.X-A: a header value cannot contain a line break"),
    "http2 not boolean": ({"http_server_config": {"http2": "yes"}}, "http_server_config.http2: must be true or false"),
    "unknown http key": ({"http_server_config": {"header": {}}}, "http_server_config.header: unknown key"),
    "bad rate interval": ({"rate_limit": {"interval": "soon", "burst": 1}}, "rate_limit.interval"),
    "zero burst": ({"rate_limit": {"interval": "1s", "burst": 0}}, "rate_limit.burst"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS.values(), ids=list(BAD_CONFIGS))
def test_invalid_files_name_the_file_and_the_key(case):
    data, expected = case
    with pytest.raises(ValueError) as info:
        parse_web_config(data, "/etc/l9gpu/web.yml")
    message = str(info.value)
    assert message.startswith("/etc/l9gpu/web.yml: ") and expected in message, message
    assert "\n" not in message
    assert "hunter2" not in message  # a secret is never echoed


def test_loader_names_missing_and_broken_files(tmp_path, pki):
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {"cert_file": "nope.crt", "key_file": str(pki.server_key)}})
    with pytest.raises(ValueError, match=r"web.yml: tls_server_config.cert_file: cannot read .*nope.crt: No such file"):
        load_web_config(str(config))
    (tmp_path / "garbage.crt").write_text("not a certificate\n")
    write_config(config, {"tls_server_config": {"cert_file": "garbage.crt", "key_file": str(pki.server_key)}})
    with pytest.raises(ValueError, match=r"tls_server_config.cert_file/key_file: cannot load"):
        load_web_config(str(config))
    write_config(config, {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.client_key)}})
    with pytest.raises(ValueError, match=r"tls_server_config.cert_file/key_file: cannot load"):
        load_web_config(str(config))  # a key that does not belong to the certificate
    write_config(config, {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                                                "client_auth_type": "RequireAndVerifyClientCert",
                                                "client_ca_file": "garbage.crt"}})
    with pytest.raises(ValueError, match=r"tls_server_config.client_ca_file: cannot load the client CA"):
        load_web_config(str(config))
    with pytest.raises(ValueError, match=r"missing.yml: cannot read: No such file"):
        load_web_config(str(tmp_path / "missing.yml"))
    (tmp_path / "bad.yml").write_text("basic_auth_users:\n  alice: [\n")
    with pytest.raises(ValueError, match=r"bad.yml: not valid YAML at line \d"):
        load_web_config(str(tmp_path / "bad.yml"))


def test_inline_certificate_and_key_load(tmp_path, pki):
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert": pki.server_cert.read_text(), "key": pki.server_key.read_text(),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca": pki.ca.read_text()}})
    loaded, context = load_web_config(str(config))
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_authenticator_checks_bcrypt_and_caches_successes():
    users = {"alice": htpasswd_hash("s3cret"), "bob": bcrypt.hashpw(b"pw", bcrypt.gensalt(12)).decode()}
    auth = BasicAuthenticator()

    async def run():
        def header(user, password):
            return basic(user, password)["Authorization"]

        assert await auth.check(users, header("alice", "s3cret"))
        assert not await auth.check(users, header("alice", "S3cret"))
        assert not await auth.check(users, header("mallory", "s3cret"))
        assert not await auth.check(users, None)
        assert not await auth.check(users, "Bearer abc")
        assert not await auth.check(users, "Basic !!!not-base64")
        assert not await auth.check(users, "Basic " + base64.b64encode(b"no-colon").decode())
        assert not await auth.check(users, header("alice", "x" * 100))  # bcrypt reads 72 bytes at most
        # bob's hash has cost 12 (hundreds of ms): later checks must come from the cache,
        # so twenty of them take less time than the one that ran bcrypt (on any machine)
        started = time.perf_counter()
        assert await auth.check(users, header("bob", "pw"))
        uncached = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(20):
            assert await auth.check(users, header("bob", "pw"))
        assert time.perf_counter() - started < uncached
        # a new hash for bob invalidates the cached success
        assert not await auth.check({**users, "bob": htpasswd_hash("other")}, header("bob", "pw"))

    try:
        asyncio.run(run())
    finally:
        auth.close()


def test_watcher_reloads_changed_files_and_keeps_the_last_good_one(tmp_path):
    config = write_config(tmp_path / "web.yml", {"basic_auth_users": {"alice": htpasswd_hash("a")}})
    now = [0.0]
    watcher = WebConfigWatcher(str(config), clock=lambda: now[0])
    try:
        write_config(config, {"basic_auth_users": {"alice": htpasswd_hash("a"), "bob": htpasswd_hash("b")}})
        assert not watcher.check()  # checked at most once a second
        now[0] = 1.5
        assert watcher.check() and set(watcher.config.users) == {"alice", "bob"}
        config.write_text("basic_auth_users: {carol: plaintext}\n")
        now[0] = 3.0
        assert not watcher.check() and set(watcher.config.users) == {"alice", "bob"}
        now[0] = 4.5
        assert not watcher.check()  # unchanged since the failed attempt: not re-read
    finally:
        watcher.close()


# ---------------------------------------------------------------- the real agent


def _fails_tls(agent: AgentProcess, ctx: ssl.SSLContext) -> BaseException:
    request = urllib.request.Request(agent.url + "/healthz")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)) as info:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
            resp.read()
    return info.value


def test_https_with_the_ca_and_not_without(tmp_path, pki, agents):
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki))
    agents.append(agent)
    status, headers, body = agent.get("/metrics")
    assert status == 200 and b"gpu_up" in body
    assert "serving node sim-node-01 with backend simulated on https://127.0.0.1:" in agent.log()
    error = _fails_tls(agent, ssl.create_default_context())  # the system's CAs do not know ours
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    # plain HTTP on the TLS port gets no answer
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/healthz", timeout=5).read()


def test_a_tls_handshake_that_never_starts_is_closed_at_the_header_deadline(tmp_path, pki, agents):
    """Connections that never send a ClientHello count against the connection cap and
    are closed once --header-timeout has passed (asyncio's own default is a minute)."""
    import socket

    config = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}})
    agent = AgentProcess([*SIM, "--web-config", str(config), "--header-timeout", "1s"],
                         log_path=tmp_path / "agent.log", scheme="https", ssl_context=client_context(pki))
    agents.append(agent)
    agent.start()
    socks = [socket.create_connection(("127.0.0.1", agent.port), timeout=PATIENCE) for _ in range(5)]
    opened = time.monotonic()
    try:
        for sock in socks:
            assert sock.recv(1) == b""  # closed by the agent
        assert time.monotonic() - opened >= 1.0
    finally:
        for sock in socks:
            sock.close()
    assert agent.get("/healthz")[0] == 200


def test_tls_version_bounds_refuse_older_clients(tmp_path, pki, agents):
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "min_version": "TLS13"}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki))
    agents.append(agent)
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    _fails_tls(agent, old)
    assert agent.get("/healthz")[0] == 200


def test_basic_auth_headers_and_probe_exemption(tmp_path, pki, agents):
    config = write_config(tmp_path / "web.yml", {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "http_server_config": {"headers": {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
                                           "Strict-Transport-Security": "max-age=31536000"}},
        "basic_auth_users": {"alice": htpasswd_hash("correct horse"), "bob": htpasswd_hash("battery")}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki), via_env=True)  # L9GPU_WEB_CONFIG
    agents.append(agent)

    status, headers, _ = agent.get("/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert headers["X-Frame-Options"] == "deny"  # on refusals too
    assert agent.get("/metrics", basic("alice", "wrong"))[0] == 401
    assert agent.get("/metrics", basic("mallory", "correct horse"))[0] == 401
    assert agent.get("/metrics", basic("bob", "correct horse"))[0] == 401  # another user's password
    assert agent.get("/")[0] == 401
    status, headers, body = agent.get("/metrics", basic("alice", "correct horse"))
    assert status == 200 and b"gpu_memory_total_bytes" in body
    assert headers["X-Frame-Options"] == "deny" and headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Strict-Transport-Security"] == "max-age=31536000"
    assert agent.get("/", basic("bob", "battery"))[0] == 200
    assert agent.get("/nope", basic("bob", "battery"))[0] == 404
    for probe in ("/healthz", "/readyz"):
        status, headers, _ = agent.get(probe)
        assert status == 200 and headers["X-Frame-Options"] == "deny"
    # repeated scrapes with the same credentials keep working (the bcrypt cache itself is
    # timed against an uncached check in test_authenticator_checks_bcrypt_and_caches_successes)
    for _ in range(10):
        assert agent.get("/metrics", basic("alice", "correct horse"))[0] == 200
    # the five refusals above, counted for whoever watches the agent under attack (in a
    # pass's rendering: /metrics serves bytes rendered up to two intervals ago)
    assert wait_until(lambda: _rejections(agent, basic("alice", "correct horse"), "auth_failed") == [5.0],
                      what="the refusals counted")
    assert _rejections(agent, basic("alice", "correct horse"), "rate_limited") == [0.0]


def test_users_reload_when_the_file_changes(tmp_path, pki, agents):
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    config = write_config(tmp_path / "web.yml", {"tls_server_config": tls,
                                                 "basic_auth_users": {"alice": htpasswd_hash("a")}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki))
    agents.append(agent)
    assert agent.get("/metrics", basic("carol", "c"))[0] == 401
    write_config(config, {"tls_server_config": tls, "basic_auth_users": {"carol": htpasswd_hash("c")}})
    wait_until(lambda: agent.get("/metrics", basic("carol", "c"))[0] == 200, what="the new user accepted")
    assert agent.get("/metrics", basic("alice", "a"))[0] == 401
    # a broken edit is logged and the last good file stays in force
    config.write_text("basic_auth_users: {carol: plaintext}\n")
    wait_until(lambda: "web config not reloaded" in agent.log(), what="the broken edit logged")
    assert "basic_auth_users.carol: not a bcrypt hash" in agent.log()
    assert agent.get("/metrics", basic("carol", "c"))[0] == 200


def test_mutual_tls_requires_a_client_certificate_from_the_ca(tmp_path, pki, agents):
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": "server.crt", "key_file": "server.key",  # relative to the file's directory
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
        "client_allowed_sans": ["prometheus.monitoring"]}})
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((pki.dir / name).read_bytes())
    agent = start_agent(tmp_path, config, ctx=client_context(pki, pki.client_cert, pki.client_key))
    agents.append(agent)
    status, _, body = agent.get("/metrics")
    assert status == 200 and b"gpu_up" in body
    _fails_tls(agent, client_context(pki))  # no client certificate
    stranger = make_pki(tmp_path / "stranger")  # a certificate from another CA
    _fails_tls(agent, client_context(pki, stranger.client_cert, stranger.client_key))
    # from our CA, but not a subject alternative name the file allows
    other = urllib.request.Request(agent.url + "/metrics")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(other, timeout=5, context=client_context(pki, pki.other_client_cert, pki.other_client_key))
    assert info.value.code == 403


BAD_FILES = {
    "unknown key": ("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  clientauth: x\n",
                    "tls_server_config.clientauth: unknown key"),
    "missing certificate file": ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n",
                                 "tls_server_config.cert_file: cannot read"),
    "not bcrypt": ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice: not a bcrypt hash"),
    "bad client auth type": ("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  client_auth_type: Always\n",
                             "tls_server_config.client_auth_type: 'Always' is not one of"),
    "bad version": ("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  max_version: TLS9\n",
                    "tls_server_config.max_version"),
    "not YAML": ("basic_auth_users: [\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", BAD_FILES.values(), ids=list(BAD_FILES))
def test_bad_files_exit_2_with_one_line(tmp_path, case):
    text, expected = case
    config = tmp_path / "web.yml"
    config.write_text(text)
    result = run_cli(["serve", *SIM, "--listen", "127.0.0.1:0", "--web-config", str(config)])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"l9gpu: --web-config {config}: "), result.stderr
    assert expected in lines[0] and "hunter2" not in lines[0]


def test_missing_file_via_environment_exits_2(tmp_path):
    result = run_cli(["serve", *SIM, "--listen", "127.0.0.1:0"], env={"L9GPU_WEB_CONFIG": str(tmp_path / "none.yml")})
    assert result.returncode == 2
    assert result.stderr.strip() == f"l9gpu: --web-config {tmp_path / 'none.yml'}: cannot read: No such file or directory"


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path, pki, agents):
    from promserver import PrometheusServer

    binary = need_tool("prometheus")
    config = write_config(tmp_path / "web.yml", {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "basic_auth_users": {"prometheus": htpasswd_hash("scrape-me")}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki))
    agents.append(agent)
    workdir = tmp_path / "prom"
    workdir.mkdir()
    server = PrometheusServer(binary, workdir, [f"127.0.0.1:{agent.port}"], scrape={
        "scheme": "https", "tls_config": {"ca_file": str(pki.ca)},
        "basic_auth": {"username": "prometheus", "password": "scrape-me"}}).start()
    try:
        up = server.wait_for('up{job="l9gpu"} == 1')
        assert up[0]["value"][1] == "1"
        assert server.wait_for("count(gpu_up == 1)")[0]["value"][1] == "8"
    finally:
        server.stop()


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path, pki, agents):
    """cert-manager or a Secret update replaces the files in place: new connections get the new one."""
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((pki.dir / name).read_bytes())
    config = write_config(tmp_path / "web.yml", {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}})
    agent = start_agent(tmp_path, config, ctx=client_context(pki))
    agents.append(agent)
    renewed = make_pki(tmp_path / "renewed")
    new_ctx = client_context(renewed)
    _fails_tls(agent, new_ctx)
    (tmp_path / "server.key").write_bytes(renewed.server_key.read_bytes())
    (tmp_path / "server.crt").write_bytes(renewed.server_cert.read_bytes())
    def renewed_certificate_served() -> bool:
        try:
            with urllib.request.urlopen(agent.url + "/healthz", timeout=PATIENCE / 2, context=new_ctx) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ssl.SSLError, ConnectionError):
            return False

    wait_until(renewed_certificate_served, what="the renewed certificate served")
    _fails_tls(agent, client_context(pki))  # the old CA no longer matches



# ---------------------------------------------------------------- auth under attack


def hash_at(password: str, cost: int) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode().replace("$2b$", "$2y$", 1)


def get_from(agent: AgentProcess, source: str, path: str = "/metrics", headers: dict[str, str] | None = None,
             timeout: float = PATIENCE / 2) -> tuple[int, dict[str, str], float]:
    """GET over plain HTTP from the loopback address ``source`` (another client address
    for the agent); (status, headers, seconds it took)."""
    import http.client

    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, dict(resp.getheaders()), time.perf_counter() - started
    finally:
        conn.close()


class WrongPasswords:
    """Threads sending wrong passwords as fast as answered, from the given addresses."""

    def __init__(self, agent: AgentProcess, sources: list[str], threads_per_source: int):
        import threading

        self.agent, self.stop = agent, threading.Event()
        self.results: list[tuple[int, str | None, float]] = []  # status, Retry-After, seconds
        self.threads = [threading.Thread(target=self._run, args=(src,), daemon=True)
                        for src in sources for _ in range(threads_per_source)]

    def _run(self, source: str) -> None:
        while not self.stop.is_set():
            try:
                status, headers, took = get_from(self.agent, source, headers=basic("alice", "wrong"), timeout=60)
            except OSError:
                continue
            self.results.append((status, headers.get("Retry-After"), took))

    def __enter__(self) -> WrongPasswords:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)


def _plain_agent(tmp_path: Path, agents: list, doc: dict) -> AgentProcess:
    agent = start_agent(tmp_path, write_config(tmp_path / "web.yml", doc), scheme="http")
    agents.append(agent)
    return agent


def test_failed_logins_take_as_long_for_unknown_users_as_for_configured_ones(tmp_path, agents):
    """No user enumeration by timing: configured users whose hashes have different costs
    (htpasswd -B defaults to 5; 10 is common) and unknown users all fail in about the time
    of the dearest hash. Medians of interleaved attempts, compared with a wide tolerance."""
    agent = _plain_agent(tmp_path, agents, {"basic_auth_users": {"cheap": hash_at("a", 4), "dear": hash_at("b", 10)}})
    assert get_from(agent, "127.0.0.1", headers=basic("dear", "b"))[0] == 200  # a known-good baseline
    times: dict[str, list[float]] = {"cheap": [], "dear": [], "nobody": []}
    for _ in range(9):
        for user in times:
            status, _, took = get_from(agent, "127.0.0.1", headers=basic(user, "wrong"))
            assert status == 401
            times[user].append(took)
    medians = {user: statistics.median(values) for user, values in times.items()}
    for user in ("cheap", "nobody"):
        ratio = medians[user] / medians["dear"]
        assert 0.5 < ratio < 2.0, medians  # cost 4 against cost 10 alone is a ratio of 1/64


def test_a_wrong_password_flood_fails_fast_and_a_new_valid_login_gets_through(tmp_path, agents):
    """300 wrong passwords at once from one address no longer queue in front of everyone:
    that address gets a few checks queued and the rest 503 with Retry-After at once, and a
    valid login not cached yet, from the scraper's address, is answered within
    Prometheus' default 10 s scrape timeout (it waited 17 s behind such a queue)."""
    agent = _plain_agent(tmp_path, agents, {"basic_auth_users": {"alice": hash_at("right", 10)}})
    with WrongPasswords(agent, ["127.0.0.3"], threads_per_source=30) as flood:
        wait_until(lambda: sum(1 for s, _, _ in flood.results if s == 503) >= 30, what="refusals of the excess")
        status, _, took = get_from(agent, "127.0.0.2", headers=basic("alice", "right"))
        assert status == 200 and took < 10.0
    refused = [(retry, took) for status, retry, took in flood.results if status == 503]
    assert all(retry == "1" for retry, _ in refused)
    # refused without waiting behind the queue (a queue of 30 cost-10 checks takes seconds)
    assert statistics.median(took for _, took in refused) < 1.0
    assert {s for s, _, _ in flood.results} <= {401, 503}


def test_cached_credentials_answer_at_once_while_the_queue_is_full(tmp_path, agents):
    """Wrong passwords from many addresses fill the bcrypt queue; a scraper whose
    credentials passed before is answered from the cache, never queued or refused."""
    agent = _plain_agent(tmp_path, agents, {"basic_auth_users": {"alice": hash_at("right", 10),
                                                                "prom": hash_at("scrape", 10)}})
    assert get_from(agent, "127.0.0.2", headers=basic("prom", "scrape"))[0] == 200  # now cached
    sources = [f"127.0.0.{i}" for i in range(3, 19)]
    with WrongPasswords(agent, sources, threads_per_source=4) as flood:
        wait_until(lambda: sum(1 for s, _, _ in flood.results if s == 503) >= 20, what="a full queue")
        cached = [get_from(agent, "127.0.0.2", headers=basic("prom", "scrape")) for _ in range(10)]
    assert all(status == 200 for status, _, _ in cached)
    assert statistics.median(took for _, _, took in cached) < 1.0


def test_rate_limit_is_per_address_and_never_charged_to_valid_credentials(tmp_path, agents):
    """rate_limit: an address sending many unauthenticated requests is refused with 429
    and Retry-After; a credential that passed before is answered all the same, and other
    addresses keep their own budget (one shared bucket refused the next valid scrape)."""
    agent = _plain_agent(tmp_path, agents, {"basic_auth_users": {"prom": hash_at("scrape", 5)},
                                            "rate_limit": {"interval": "10s", "burst": 5}})
    assert get_from(agent, "127.0.0.3", headers=basic("prom", "scrape"))[0] == 200  # charged: not yet cached
    statuses = [get_from(agent, "127.0.0.3")[:2] for _ in range(30)]
    assert [s for s, _ in statuses].count(401) <= 5 and [s for s, _ in statuses].count(429) >= 24
    assert all(int(h["Retry-After"]) >= 1 for s, h in statuses if s == 429)
    for _ in range(10):  # the cached credential, from the address that is over its limit
        assert get_from(agent, "127.0.0.3", headers=basic("prom", "scrape"))[0] == 200
    assert get_from(agent, "127.0.0.4")[0] == 401  # another address: its own bucket
    assert get_from(agent, "127.0.0.4", headers=basic("prom", "scrape"))[0] == 200
    codes = [s for s, _ in statuses]
    wait_until(lambda: _rejections(agent, basic("prom", "scrape"), "rate_limited") == [float(codes.count(429))],
               what="the 429s counted")
    assert _rejections(agent, basic("prom", "scrape"), "auth_failed") == [float(codes.count(401) + 1)]


def _rejections(agent: AgentProcess, headers: dict[str, str], reason: str) -> list[float]:
    status, _, body = agent.get("/metrics", headers)
    assert status == 200, body
    return pick(parse_metrics(body.decode()), "l9gpu_http_rejections_total", reason=reason)
