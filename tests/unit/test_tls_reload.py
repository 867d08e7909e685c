"""A renewed serving certificate is served to new connections without a restart (tls.py)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.service.metrics import ExtenderMetrics
from scheduler_extender.service.tls import CertificateReloader
from tests.harness.tls import ExtenderPKI, generate_extender_pki


def served_certificate(server: ssl.SSLContext) -> bytes:
    """DER of the certificate ``server`` presents in a TLS handshake over memory BIOs (the client
    only looks: both test CAs carry one name, so it could not tell them apart to verify)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(20):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return c.getpeercert(binary_form=True)


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


@pytest.fixture
def setup(tmp_path):
    old, new = generate_extender_pki(tmp_path / "old"), generate_extender_pki(tmp_path / "new")
    live = tmp_path / "live"  # what the Secret volume holds
    live.mkdir()
    shutil.copy(old.server_crt, live / "tls.crt")
    shutil.copy(old.server_key, live / "tls.key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(live / "tls.crt", live / "tls.key")
    metrics = ExtenderMetrics(CollectorRegistry())
    reloader = CertificateReloader(live / "tls.crt", live / "tls.key", context, metrics.tls_reloads)
    return old, new, live, context, reloader, metrics


def renew(live: Path, pki: ExtenderPKI, key: Path | None = None) -> None:
    shutil.copy(pki.server_crt, live / "tls.crt")
    shutil.copy(key or pki.server_key, live / "tls.key")


def test_a_renewed_certificate_is_presented_to_the_next_handshake(setup):
    old, new, live, context, reloader, metrics = setup
    assert served_certificate(context) == der(old.server_crt)
    assert reloader.check_once() is None  # unchanged
    renew(live, new)
    assert reloader.check_once() is True
    assert served_certificate(context) == der(new.server_crt)
    assert reloader.check_once() is None
    assert metrics.tls_reloads.labels("applied")._value.get() == 1


def test_a_pair_that_does_not_load_is_rejected_once_and_the_old_one_stays(setup, caplog):
    old, new, live, context, reloader, metrics = setup
    renew(live, new, key=old.server_key)  # the new certificate with the old key: they do not match
    assert reloader.check_once() is False
    assert reloader.check_once() is None  # reported once, not at every poll
    assert served_certificate(context) == der(old.server_crt)
    assert metrics.tls_reloads.labels("rejected")._value.get() == 1
    assert "still serving the previous one" in caplog.text
    renew(live, new)  # the key follows
    assert reloader.check_once() is True
    assert served_certificate(context) == der(new.server_crt)


def test_files_missing_for_a_moment_change_nothing(setup):
    old, new, live, context, reloader, _ = setup
    (live / "tls.key").unlink()
    assert reloader.check_once() is None
    assert served_certificate(context) == der(old.server_crt)


def test_the_loop_checks_at_its_interval(setup):
    old, new, live, context, reloader, _ = setup
    renew(live, new)

    async def main():
        task = asyncio.create_task(reloader.run(0.01))
        while served_certificate(context) != der(new.server_crt):
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
