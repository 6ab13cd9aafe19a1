"""topups

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('chain_scan_cursors',
    sa.Column('scan_group', sa.String(length=40), nullable=False),
    sa.Column('cursor', sa.String(length=400), nullable=True),
    sa.Column('updated_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('scan_group')
    )
    op.create_table('deposit_address_counters',
    sa.Column('coin', sa.String(length=16), nullable=False),
    sa.Column('key_id', sa.String(length=80), nullable=False),
    sa.Column('last_index', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('coin', 'key_id')
    )
    op.create_table('topups',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('ref', sa.String(length=40), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('coin', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('amount_micros', sa.BigInteger(), nullable=False),
    sa.Column('rate', sa.String(length=40), nullable=False),
    sa.Column('deposit_address', sa.String(length=200), nullable=True),
    sa.Column('deposit_amount_atomic', sa.String(length=40), nullable=False),
    sa.Column('deposit_network', sa.String(length=40), nullable=True),
    sa.Column('address_index', sa.BigInteger(), nullable=True),
    sa.Column('watch_key', sa.String(length=200), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('registered', sa.Boolean(), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('completed_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('cancelled_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('account_id', 'idempotency_key', name='uq_topups_account_idempotency'),
    sa.UniqueConstraint('coin', 'watch_key', name='uq_topups_coin_watch_key'),
    sa.UniqueConstraint('ref')
    )
    with op.batch_alter_table('topups', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_topups_account_id'), ['account_id'], unique=False)
        batch_op.create_index('ix_topups_status_expires', ['status', 'expires_at'], unique=False)
        batch_op.create_index('ix_topups_coin_registered', ['coin', 'registered'], unique=False)

    op.create_table('topup_payments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('coin', sa.String(length=16), nullable=False),
    sa.Column('identity', sa.String(length=200), nullable=False),
    sa.Column('topup_id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('txid', sa.String(length=128), nullable=False),
    sa.Column('amount_atomic', sa.String(length=40), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('confirmations', sa.Integer(), nullable=False),
    sa.Column('block_height', sa.BigInteger(), nullable=True),
    sa.Column('block_hash', sa.String(length=128), nullable=True),
    sa.Column('late', sa.Boolean(), nullable=False),
    sa.Column('rate', sa.String(length=40), nullable=True),
    sa.Column('credited_micros', sa.BigInteger(), nullable=True),
    sa.Column('ledger_entry_id', sa.Integer(), nullable=True),
    sa.Column('first_seen_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('credited_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.ForeignKeyConstraint(['ledger_entry_id'], ['ledger_entries.id'], ),
    sa.ForeignKeyConstraint(['topup_id'], ['topups.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('coin', 'identity', name='uq_topup_payments_coin_identity')
    )
    with op.batch_alter_table('topup_payments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_topup_payments_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_topup_payments_topup_id'), ['topup_id'], unique=False)

    op.create_table('x402_payments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('coin', sa.String(length=16), nullable=False),
    sa.Column('payer', sa.String(length=64), nullable=False),
    sa.Column('nonce', sa.String(length=80), nullable=False),
    sa.Column('topup_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('amount_atomic', sa.String(length=40), nullable=False),
    sa.Column('header', sa.Text(), nullable=False),
    sa.Column('requirements', sa.Text(), nullable=False),
    sa.Column('transaction', sa.String(length=128), nullable=True),
    sa.Column('network', sa.String(length=40), nullable=True),
    sa.Column('error', sa.String(length=200), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('settled_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['topup_id'], ['topups.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('coin', 'payer', 'nonce', name='uq_x402_payments_payer_nonce')
    )
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_x402_payments_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_x402_payments_topup_id'), ['topup_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_x402_payments_topup_id'))
        batch_op.drop_index(batch_op.f('ix_x402_payments_status'))

    op.drop_table('x402_payments')
    with op.batch_alter_table('topup_payments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_topup_payments_topup_id'))
        batch_op.drop_index(batch_op.f('ix_topup_payments_status'))

    op.drop_table('topup_payments')
    with op.batch_alter_table('topups', schema=None) as batch_op:
        batch_op.drop_index('ix_topups_status_expires')
        batch_op.drop_index('ix_topups_coin_registered')
        batch_op.drop_index(batch_op.f('ix_topups_account_id'))

    op.drop_table('topups')
    op.drop_table('deposit_address_counters')
    op.drop_table('chain_scan_cursors')
