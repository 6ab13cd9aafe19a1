"""accounts, api keys, ledger, servers

Revision ID: 0001
Revises: 
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('accounts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('balance_micros', sa.BigInteger(), nullable=False),
    sa.Column('totp_enabled', sa.Boolean(), nullable=False),
    sa.Column('login_selector', sa.String(length=32), nullable=False),
    sa.Column('login_hash', sa.String(length=200), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.CheckConstraint('balance_micros >= 0', name='ck_accounts_balance_nonnegative'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('login_selector')
    )
    op.create_table('api_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash')
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_account_id'), ['account_id'], unique=False)

    op.create_table('ledger_entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('balance_after_micros', sa.BigInteger(), nullable=False),
    sa.Column('reason', sa.String(length=32), nullable=False),
    sa.Column('ref', sa.String(length=200), nullable=True),
    sa.Column('dedupe_key', sa.String(length=200), nullable=True),
    sa.Column('memo', sa.String(length=500), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ledger_entries_account_id'), ['account_id'], unique=False)

    op.create_table('servers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('plan', sa.String(length=32), nullable=False),
    sa.Column('location', sa.String(length=32), nullable=False),
    sa.Column('os', sa.String(length=32), nullable=False),
    sa.Column('hostname', sa.String(length=63), nullable=False),
    sa.Column('cycle', sa.String(length=16), nullable=False),
    sa.Column('price_micros', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('ip', sa.String(length=45), nullable=True),
    sa.Column('username', sa.String(length=32), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_servers_account_id'), ['account_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_servers_expires_at'), ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_servers_status'), ['status'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_servers_status'))
        batch_op.drop_index(batch_op.f('ix_servers_expires_at'))
        batch_op.drop_index(batch_op.f('ix_servers_account_id'))

    op.drop_table('servers')
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ledger_entries_account_id'))

    op.drop_table('ledger_entries')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_account_id'))

    op.drop_table('api_keys')
    op.drop_table('accounts')
