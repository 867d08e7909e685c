"""The extender's serving certificate, kept current with its files while the server runs.

cert-manager renews a certificate into its Secret, and the kubelet updates the Secret's volume in
place (an atomic swap of the ``..data`` symlink); until now the extender read the files only at
start, so a renewal took effect at the next restart, and a pod that outlived its certificate
served an expired one. :class:`CertificateReloader` polls the files' content and loads a changed
pair into the live ``SSLContext``: the next TLS handshakes present it, connections already open
keep theirs (``SSLContext.load_cert_chain`` on the context the server's sockets were created with;
Python ``ssl`` docs).

A pair that does not load (a key that does not match the certificate, a half-written file) is
rejected: it is first tried on a context of its own, so the live one keeps serving the old pair.
The client CA bundle (``--tls-client-ca-file``) is read at start only: OpenSSL can add trusted
CAs to a live context but not remove them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

RELOAD_INTERVAL_SECONDS = 10.0
"""Default poll interval; the kubelet itself refreshes Secret volumes about once a minute."""


class CertificateReloader:
    """Loads ``certfile``/``keyfile`` into ``context`` whenever their content changes.

    ``reloads``: a counter with a ``result`` label (``applied``, ``rejected``), or None.
    """

    def __init__(self, certfile: str | Path, keyfile: str | Path, context: ssl.SSLContext,
                 reloads: Counter | None = None) -> None:
        self.certfile, self.keyfile, self.context, self.reloads = Path(certfile), Path(keyfile), context, reloads
        self._loaded = self._fingerprint()  # what the server was started with

    def _fingerprint(self) -> str | None:
        try:
            return hashlib.sha256(self.certfile.read_bytes() + b"\0" + self.keyfile.read_bytes()).hexdigest()
        except OSError:
            return None  # mid-swap or gone: try again at the next poll

    def check_once(self) -> bool | None:
        """Load a changed pair. True: applied; False: rejected (logged, counted, the old pair
        stays); None: unchanged or unreadable right now."""
        seen = self._fingerprint()
        if seen is None or seen == self._loaded:
            return None
        try:
            # on a context of its own first: a failed load_cert_chain may leave a context half-changed
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.certfile, self.keyfile)
            self.context.load_cert_chain(self.certfile, self.keyfile)
        except (ssl.SSLError, OSError) as e:
            self._loaded = seen  # reported once per content, not at every poll
            log.error("renewed TLS certificate %s / key %s rejected, still serving the previous one: %s",
                      self.certfile, self.keyfile, e)
            if self.reloads is not None:
                self.reloads.labels("rejected").inc()
            return False
        self._loaded = seen
        log.info("TLS certificate reloaded from %s", self.certfile)
        if self.reloads is not None:
            self.reloads.labels("applied").inc()
        return True

    async def run(self, interval_seconds: float = RELOAD_INTERVAL_SECONDS) -> None:
        """Forever: every ``interval_seconds``, ``check_once``. On the event loop, which also makes
        the handshakes: OpenSSL does not allow changing a context while another thread creates a
        connection from it, and reading two small files takes microseconds."""
        while True:
            await asyncio.sleep(interval_seconds)
            self.check_once()
