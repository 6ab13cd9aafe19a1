"""Every database column holding a Fernet token is in ``vpsshop.encryption.ENCRYPTED_COLUMNS``, so that
``vpsshop admin rotate-keys`` re-encrypts it: a shop with every kind of stored secret is searched column
by column for tokens. After a rotation, a process holding only the new key uses every stored secret
(a worker provisions a server whose user data was encrypted under the old key)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from sqlmodel import SQLModel, select
from starlette.testclient import TestClient

from vpsshop import twofactor
from vpsshop.actors import Customer, Operator
from vpsshop.app import create_app
from vpsshop.assembly import build_context
from vpsshop.encryption import ENCRYPTED_COLUMNS, rotate_stored_secrets
from vpsshop.events import signing
from vpsshop.events.models import WebhookEndpoint
from vpsshop.models import Server
from vpsshop.operators import add_operator
from vpsshop.servers.jobs import run_jobs
from vpsshop.settings import load_settings
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
USER_DATA = "#cloud-config\npackages: [htop]\n"
NEW_KEY = Fernet.generate_key().decode()
FERNET_TOKEN_START = "gAAAAA"  # version byte 0x80 and the first timestamp bytes, in url-safe base64


@pytest.fixture
def vpsshop_overrides():
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}}


def _every_kind_of_secret(client, account) -> int:
    """A server with a root password and user data, a two-factor enrolment, a webhook endpoint."""
    account.credit("10")
    ordered = client.post("/v1/servers", headers=account.headers, json={**ORDER, "user_data": USER_DATA})
    assert ordered.status_code == 201, ordered.text
    asyncio.run(twofactor.begin_enrolment(client.app.state.ctx, Customer(account.user_id)))
    hook = client.post("/v1/webhooks", headers=account.headers, json={"url": "https://example.com/hook"})
    assert hook.status_code == 201, hook.text
    add_operator(client.app.state.ctx, Operator("root"), "ops", "owner", "a long enough password")
    return ordered.json()["server"]["id"]


def _columns_holding_tokens(engine: sa.Engine) -> set[tuple[str, str]]:
    found = set()
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        for table in inspector.get_table_names():
            for column in inspector.get_columns(table):
                if not isinstance(column["type"], sa.String):
                    continue
                query = (
                    sa.select(sa.literal(1))
                    .select_from(sa.table(table))
                    .where(sa.column(column["name"]).like(FERNET_TOKEN_START + "%"))
                    .limit(1)
                )
                if conn.execute(query).first() is not None:
                    found.add((table, column["name"]))
    return found


def test_every_column_holding_a_fernet_token_is_rotated(vpsshop_client, vpsshop_account):
    _every_kind_of_secret(vpsshop_client, vpsshop_account)
    listed = {(table, column) for table, _pk, column in ENCRYPTED_COLUMNS}
    assert _columns_holding_tokens(vpsshop_client.app.state.ctx.db.engine) == listed


def test_every_model_column_named_enc_is_listed():
    import vpsshop.events.models
    import vpsshop.payments.models
    import vpsshop.servers.models  # noqa: F401

    listed = {(table, column) for table, _pk, column in ENCRYPTED_COLUMNS}
    named = {
        (table.name, column.name)
        for table in SQLModel.metadata.tables.values()
        for column in table.columns
        if column.name.endswith(("_enc", "_encrypted"))
    }
    assert named == listed


def _settings(database_url: str, key: str, old: list[str]):
    return load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": database_url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": key,
            "old_encryption_keys": old,
            "server": {"background": False, "access_log": False},
            "hypervisor": {"simulator": {"boot_seconds": 0}},
        },
    )


def test_after_rotation_the_new_key_alone_opens_every_stored_secret(
    vpsshop_client, vpsshop_account, vpsshop_database_url, vpsshop_clock
):
    sid = _every_kind_of_secret(vpsshop_client, vpsshop_account)  # not provisioned yet
    rotating = build_context(_settings(vpsshop_database_url, NEW_KEY, [TEST_ENCRYPTION_KEY]))
    try:
        counts = rotate_stored_secrets(rotating)
    finally:
        rotating.db.dispose()
    assert counts["servers.user_data_enc"] == 1 and counts["servers.root_password_enc"] == 1
    assert counts["accounts.totp_secret_enc"] == 1 and counts["webhook_endpoints.secret_enc"] == 1

    app = create_app(_settings(vpsshop_database_url, NEW_KEY, []), clock=vpsshop_clock, background=False)
    with TestClient(app) as client:
        ctx = client.app.state.ctx
        assert asyncio.run(run_jobs(ctx))["done"] == 1  # the user data decrypts for the create job
        with ctx.db.session() as session:
            assert session.get(Server, sid).status == "active"
            endpoint = session.exec(select(WebhookEndpoint)).one()
        assert signing.decrypt_secret(ctx, endpoint.secret_enc).startswith("whsec_")
        assert asyncio.run(twofactor.begin_enrolment(ctx, Customer(vpsshop_account.user_id))).secret
        revealed = client.get(f"/v1/servers/{sid}/credentials", headers=vpsshop_account.headers)
        assert revealed.status_code == 200 and revealed.json()["password"]
