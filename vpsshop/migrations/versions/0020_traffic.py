"""server_traffic: each server's network traffic per traffic period (issue 28 part 3)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'server_traffic',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('server_id', sa.Integer(), nullable=False),
        sa.Column('period_start', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('in_bytes', sa.BigInteger(), nullable=False),
        sa.Column('out_bytes', sa.BigInteger(), nullable=False),
        sa.Column('last_in', sa.BigInteger(), nullable=True),
        sa.Column('last_out', sa.BigInteger(), nullable=True),
        sa.Column('sampled_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('allowance_bytes', sa.BigInteger(), nullable=True),
        sa.Column('policy_applied', sa.String(length=16), nullable=True),
        sa.Column('applied_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('lifted_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['server_id'], ['servers.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('server_id', 'period_start', name='uq_server_traffic_period'),
    )
    with op.batch_alter_table('server_traffic', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_server_traffic_server_id'), ['server_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('server_traffic', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_server_traffic_server_id'))
    op.drop_table('server_traffic')
