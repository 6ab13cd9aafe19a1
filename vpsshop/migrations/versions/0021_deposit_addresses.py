"""deposit_addresses, topups.deposit_address_id, topup_payments.deposit_address_id: standing deposit
addresses (issue 26 part 3); topup_payments.topup_id becomes nullable (a receipt has no top-up until it
is credited)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'deposit_addresses',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('account_id', sa.Integer(), nullable=False),
        sa.Column('coin', sa.String(length=16), nullable=False),
        sa.Column('address', sa.String(length=200), nullable=False),
        sa.Column('network', sa.String(length=40), nullable=True),
        sa.Column('key_id', sa.String(length=80), nullable=False),
        sa.Column('number', sa.BigInteger(), nullable=False),
        sa.Column('watch_key', sa.String(length=200), nullable=False),
        sa.Column('registered', sa.Boolean(), nullable=False),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['account_id'], ['accounts.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('account_id', 'coin', name='uq_deposit_addresses_account_coin'),
        sa.UniqueConstraint('coin', 'watch_key', name='uq_deposit_addresses_coin_watch_key'),
    )
    with op.batch_alter_table('deposit_addresses', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deposit_addresses_account_id'), ['account_id'], unique=False)
        batch_op.create_index('ix_deposit_addresses_coin_registered', ['coin', 'registered'], unique=False)
    with op.batch_alter_table('topups', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deposit_address_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_topups_deposit_address_id'), ['deposit_address_id'], unique=False)
        batch_op.create_foreign_key(
            'fk_topups_deposit_address_id', 'deposit_addresses', ['deposit_address_id'], ['id']
        )
    with op.batch_alter_table('topup_payments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deposit_address_id', sa.Integer(), nullable=True))
        batch_op.create_index(
            batch_op.f('ix_topup_payments_deposit_address_id'), ['deposit_address_id'], unique=False
        )
        batch_op.create_foreign_key(
            'fk_topup_payments_deposit_address_id', 'deposit_addresses', ['deposit_address_id'], ['id']
        )
        batch_op.alter_column('topup_id', existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute('DELETE FROM topup_payments WHERE topup_id IS NULL')
    with op.batch_alter_table('topup_payments', schema=None) as batch_op:
        batch_op.alter_column('topup_id', existing_type=sa.Integer(), nullable=False)
        batch_op.drop_constraint('fk_topup_payments_deposit_address_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_topup_payments_deposit_address_id'))
        batch_op.drop_column('deposit_address_id')
    with op.batch_alter_table('topups', schema=None) as batch_op:
        batch_op.drop_constraint('fk_topups_deposit_address_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_topups_deposit_address_id'))
        batch_op.drop_column('deposit_address_id')
    with op.batch_alter_table('deposit_addresses', schema=None) as batch_op:
        batch_op.drop_index('ix_deposit_addresses_coin_registered')
        batch_op.drop_index(batch_op.f('ix_deposit_addresses_account_id'))
    op.drop_table('deposit_addresses')
