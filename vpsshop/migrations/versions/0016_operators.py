"""operators: the web console's operator accounts and their sessions

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'operators',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('role', sa.String(length=16), nullable=False),
        sa.Column('password_hash', sa.String(length=200), nullable=False),
        sa.Column('totp_secret_enc', sa.String(length=500), nullable=False),
        sa.Column('totp_last_step', sa.BigInteger(), nullable=True),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('disabled_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('last_signin_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
    )
    op.create_table(
        'operator_sessions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('operator_id', sa.Integer(), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('user_agent', sa.String(length=200), nullable=True),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('last_seen_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('ended_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['operator_id'], ['operators.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('token_hash'),
    )
    op.create_index('ix_operator_sessions_operator_id', 'operator_sessions', ['operator_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_operator_sessions_operator_id', table_name='operator_sessions')
    op.drop_table('operator_sessions')
    op.drop_table('operators')
