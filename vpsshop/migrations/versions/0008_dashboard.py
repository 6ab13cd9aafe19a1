"""dashboard: sessions, two-factor (TOTP secret, recovery codes), rate-limit counters

Revision ID: 0008
Revises: 0002, 0003
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0008'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('totp_secret_enc', sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column('totp_last_step', sa.BigInteger(), nullable=True))

    op.create_table('recovery_codes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('code_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('used_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('code_hash')
    )
    with op.batch_alter_table('recovery_codes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_recovery_codes_account_id'), ['account_id'], unique=False)

    op.create_table('dashboard_sessions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('pending_totp', sa.Boolean(), nullable=False),
    sa.Column('user_agent', sa.String(length=200), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('ended_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    with op.batch_alter_table('dashboard_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_dashboard_sessions_account_id'), ['account_id'], unique=False)

    op.create_table('rate_limit_counters',
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('window_start', sa.BigInteger(), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key', 'window_start')
    )
    with op.batch_alter_table('rate_limit_counters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rate_limit_counters_window_start'), ['window_start'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rate_limit_counters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rate_limit_counters_window_start'))
    op.drop_table('rate_limit_counters')
    with op.batch_alter_table('dashboard_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_dashboard_sessions_account_id'))
    op.drop_table('dashboard_sessions')
    with op.batch_alter_table('recovery_codes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_recovery_codes_account_id'))
    op.drop_table('recovery_codes')
    # without its secret two-factor cannot be checked: turn it off rather than lock accounts out
    op.execute(sa.text('UPDATE accounts SET totp_enabled = false'))
    with op.batch_alter_table('accounts', schema=None) as batch_op:
        batch_op.drop_column('totp_last_step')
        batch_op.drop_column('totp_secret_enc')
