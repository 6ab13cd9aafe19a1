"""wallets, siwx_nonces: wallets that own accounts and used sign-in-with-x nonces (issue 29)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'wallets',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('account_id', sa.Integer(), nullable=False),
        sa.Column('address', sa.String(length=64), nullable=False),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('credentials_pending', sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(['account_id'], ['accounts.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('address'),
    )
    op.create_index(op.f('ix_wallets_account_id'), 'wallets', ['account_id'], unique=False)
    op.create_table(
        'siwx_nonces',
        sa.Column('nonce', sa.String(length=64), nullable=False),
        sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('nonce'),
    )
    op.create_index(op.f('ix_siwx_nonces_expires_at'), 'siwx_nonces', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_siwx_nonces_expires_at'), table_name='siwx_nonces')
    op.drop_table('siwx_nonces')
    op.drop_index(op.f('ix_wallets_account_id'), table_name='wallets')
    op.drop_table('wallets')
