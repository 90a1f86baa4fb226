"""The web config file on disk: read and proved at start, re-read when it changes.

`load_web_config` reads the file, checks every file it names and builds the TLS context
once to prove it works. `WebConfigWatcher` re-reads the file (and the certificate files
it names) when their modification times change, checked at most once a second; a file
that no longer loads is logged and the last good configuration stays in force.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import time
from typing import Any, Awaitable, Callable

from aiohttp import web

from exporter.output.counts import Rejections
from exporter.web.access import AccessControl
from exporter.web.tls import apply_tls, build_ssl_context
from exporter.web.webconfig import WebConfig, config_error, parse_web_config

# The logger's name is the one these lines have always been logged under.
log = logging.getLogger("exporter.webconfig")


def _read_yaml(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as src:
            text = src.read()
    except OSError as exc:
        raise config_error(path, "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise config_error(path, "", "not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise config_error(path, "", f"not valid YAML{where}: {problem}") from None


def load_web_config(path: str) -> tuple[WebConfig, ssl.SSLContext | None]:
    """Read, validate and prove a web config file: the config and its TLS context (or None).

    Raises:
        ValueError: one line naming the file and the key.
    """
    config = parse_web_config(_read_yaml(path), path)
    context = None
    if config.tls is not None:
        # Read every file once: the context is built, and on reload applied to the live
        # one, from these same bytes, so a file replaced in between cannot half-apply.
        contents: dict[str, str] = {}
        for key, file in config.tls.files():
            try:
                with open(file, encoding="ascii") as src:
                    contents[key.removesuffix("_file")] = src.read()
            except OSError as exc:
                raise config_error(path, f"tls_server_config.{key}",
                                   f"cannot read {file}: {exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise config_error(path, f"tls_server_config.{key}", f"{file} is not a PEM file") from None
        tls = dataclasses.replace(config.tls, cert=contents.get("cert", config.tls.cert),
                                  key=contents.get("key", config.tls.key),
                                  client_ca=contents.get("client_ca", config.tls.client_ca))
        config = dataclasses.replace(config, tls=tls)
        context = build_ssl_context(tls, path)
    if config.users:
        try:
            import bcrypt  # noqa: F401 - checked here so a missing package fails at start-up
        except ImportError:
            raise config_error(path, "basic_auth_users", "checking bcrypt hashes needs the Python package bcrypt "
                                                  "(pip install bcrypt)") from None
    return config, context


def _fingerprint(files: tuple[str, ...]) -> tuple[Any, ...]:
    out: list[tuple[Any, ...]] = []
    for file in files:
        try:
            st = os.stat(file)
            out.append((file, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((file, None))
    return tuple(out)


class WebConfigWatcher:
    """The current web config: reloaded when the file or its certificates change.

    Args:
        path: the web config file.
        clock: monotonic seconds (injected for tests).
        check_interval: the files' modification times are looked at no more often.
        rejections: where refused requests are counted (403, 429, 503, 401).

    Raises:
        ValueError: when the file does not load at start-up.
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic, check_interval: float = 1.0,
                 rejections: Rejections | None = None):
        self.rejections = rejections if rejections is not None else Rejections()
        self.path = path
        self._clock = clock
        self.check_interval = check_interval
        self.config, self.ssl_context = load_web_config(path)
        self._fingerprint = _fingerprint(self.config.files())
        self._checked_at = clock()
        self.access = AccessControl(lambda: self.config, clock, self.rejections)
        self._log_unapplied(self.config)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def _log_unapplied(self, config: WebConfig) -> None:
        tls = config.tls
        if tls is not None and (tls.cipher_suites or tls.curve_preferences):
            log.warning("%s: tls_server_config cipher_suites and curve_preferences are not applied (Go names with no "
                        "faithful OpenSSL mapping); OpenSSL's defaults for the TLS versions allowed are used",
                        config.path)
        if tls is not None and tls.client_auth_type == "RequireAnyClientCert":
            log.warning("%s: client_auth_type RequireAnyClientCert: client certificates are verified against the "
                        "client CA as well (RequireAndVerifyClientCert)", config.path)
        if config.users and self.ssl_context is None:
            log.warning("%s: basic auth without TLS sends passwords in clear text; add tls_server_config",
                        config.path)

    def check(self) -> bool:
        """Reload if the files changed since the last look (at most once per interval)."""
        now = self._clock()
        if now - self._checked_at < self.check_interval:
            return False
        self._checked_at = now
        fingerprint = _fingerprint(self.config.files())
        if fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint
        try:
            config, context = load_web_config(self.path)
        except ValueError as exc:
            log.error("web config not reloaded, the last good one stays in force: %s", exc)
            return False
        if (context is None) != (self.ssl_context is None):
            log.error("web config not reloaded: turning TLS %s needs a restart",
                      "on" if context is not None else "off")
            return False
        if config.tls is not None and self.ssl_context is not None:
            try:
                apply_tls(self.ssl_context, config.tls, self.path)
            except ValueError as exc:  # the file changed again between load and apply
                log.error("web config not reloaded: %s", exc)
                return False
        self._fingerprint = _fingerprint(config.files())
        self.config = config
        self.access.reset()
        self._log_unapplied(config)
        log.info("web config %s reloaded", self.path)
        return True

    async def watch(self) -> None:
        """Check for changes forever (run as a task next to the server)."""
        while True:
            await asyncio.sleep(self.check_interval)
            self.check()

    @property
    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """aiohttp middleware: the current config's client SANs, rate limit and basic auth,
        then its response headers (`AccessControl.middleware`)."""
        return self.access.middleware

    def close(self) -> None:
        self.access.close()
