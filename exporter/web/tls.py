"""TLS server contexts from a web config's ``tls_server_config``.

`build_ssl_context` makes a context once, to prove at start that the certificate, key
and client CA load; `apply_tls` loads a reloaded section into the live context, so new
connections see the new certificate. Failures are the web config's one-line errors.
"""

from __future__ import annotations

import os
import ssl
import tempfile

from exporter.web.webconfig import TLS_VERSIONS, TLSServerConfig, config_error


def _load_chain(ctx: ssl.SSLContext, tls: TLSServerConfig) -> None:
    if not tls.cert and not tls.key:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
        return
    # ssl loads certificates only from files: PEM text goes through a private temp dir
    with tempfile.TemporaryDirectory(prefix="l9gpu-tls-") as tmp:
        cert, key = tls.cert_file, tls.key_file
        if tls.cert:
            cert = os.path.join(tmp, "cert.pem")
            with open(cert, "w") as out:
                out.write(tls.cert)
        if tls.key:
            key = os.path.join(tmp, "key.pem")
            with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as out:
                out.write(tls.key)
        ctx.load_cert_chain(cert, key)


def apply_tls(ctx: ssl.SSLContext, tls: TLSServerConfig, path: str = "") -> None:
    """Load ``tls`` into a server context: certificate, client CA, verify mode, versions.

    Used for a new context and, on reload, for the live one: new connections see the new
    certificate and settings. (A client CA removed from the file stays trusted until the
    agent restarts: ssl can add to a context's trust store but not remove from it.)

    Raises:
        ValueError: naming the file and key when a certificate, key or CA does not load.
    """
    try:
        _load_chain(ctx, tls)
    except (ssl.SSLError, OSError) as exc:
        where = "cert_file/key_file" if tls.cert_file or tls.key_file else "cert/key"
        raise config_error(path, f"tls_server_config.{where}",
                    f"cannot load the certificate and key: {getattr(exc, 'reason', None) or exc}") from None
    if tls.client_ca_file or tls.client_ca:
        try:
            if tls.client_ca:
                ctx.load_verify_locations(cadata=tls.client_ca)
            else:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            key = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise config_error(path, f"tls_server_config.{key}",
                        f"cannot load the client CA: {getattr(exc, 'reason', None) or exc}") from None
    ctx.verify_mode = tls.verify_mode
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


def build_ssl_context(tls: TLSServerConfig, path: str = "") -> ssl.SSLContext:
    """A server-side context for ``tls`` (see `apply_tls`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    apply_tls(ctx, tls, path)
    return ctx
