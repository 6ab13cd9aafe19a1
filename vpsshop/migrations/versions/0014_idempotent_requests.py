"""idempotent_requests: the answers of operations made under an idempotency key (renewals)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'idempotent_requests',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('account_id', sa.Integer(), nullable=False),
        sa.Column('operation', sa.String(length=32), nullable=False),
        sa.Column('key', sa.String(length=300), nullable=False),
        sa.Column('request_digest', sa.String(length=64), nullable=False),
        sa.Column('response', sa.Text(), nullable=False),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['account_id'], ['accounts.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('account_id', 'operation', 'key', name='uq_idempotent_requests_account_operation_key'),
    )


def downgrade() -> None:
    op.drop_table('idempotent_requests')
