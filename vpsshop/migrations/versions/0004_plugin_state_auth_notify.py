"""plugin records (vpsshop.PluginState); PostgreSQL: NOTIFY vpsshop_auth when what a key sees changes

Revision ID: 0004
Revises: 0002, 0003
Create Date: 2026-11-22

On PostgreSQL, triggers on ``accounts``, ``api_keys`` and ``servers`` send ``NOTIFY vpsshop_auth``
with the account id whenever something ``GET /v1/account`` shows (or the validity of a key)
changes, whoever writes it: the API, ``vpsshop worker``, ``vpsshop admin credit``, or an operator
in psql. Each API process keeps its authentication cache only while it listens on that channel
(see ``vpsshop/authcache.py``). A ``TRUNCATE`` notifies ``*`` (forget everything).
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0004'
down_revision = ('0002', '0003')
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION vpsshop_auth_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    account bigint;
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        PERFORM pg_notify('vpsshop_auth', '*');
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'accounts' THEN
        IF TG_OP = 'DELETE' THEN account := OLD.id; ELSE account := NEW.id; END IF;
    ELSIF TG_OP = 'DELETE' THEN
        account := OLD.account_id;
    ELSE
        account := NEW.account_id;
        IF TG_OP = 'UPDATE' THEN
            IF OLD.account_id <> NEW.account_id THEN
                PERFORM pg_notify('vpsshop_auth', OLD.account_id::text);
            END IF;
        END IF;
    END IF;
    PERFORM pg_notify('vpsshop_auth', account::text);
    RETURN NULL;
END
$$
"""

_TRIGGERS = {
    # (table, events of the row trigger)
    "accounts": "UPDATE OR DELETE",
    "api_keys": "UPDATE OR DELETE",
    "servers": "INSERT OR UPDATE OF status OR DELETE",
}


def upgrade() -> None:
    op.create_table('plugin_records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('namespace', sa.String(length=64), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('namespace', 'key', name='uq_plugin_records_namespace_key')
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        for table, events in _TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {table}_auth_changed AFTER {events} ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION vpsshop_auth_changed()")
            op.execute(f"CREATE TRIGGER {table}_auth_truncated AFTER TRUNCATE ON {table} "
                       f"FOR EACH STATEMENT EXECUTE FUNCTION vpsshop_auth_changed()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_auth_changed ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_auth_truncated ON {table}")
        op.execute("DROP FUNCTION IF EXISTS vpsshop_auth_changed()")
    op.drop_table('plugin_records')
