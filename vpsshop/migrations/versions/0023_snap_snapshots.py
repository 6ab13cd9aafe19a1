"""server_snapshots and servers.snapshot_fee_micros: server snapshots (issue 25, part 4)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'server_snapshots',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('server_id', sa.Integer(), nullable=False),
        sa.Column('label', sa.String(length=64), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('plan', sa.String(length=32), nullable=False),
        sa.Column('fee_micros', sa.BigInteger(), nullable=False),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('ready_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column('deleted_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['server_id'], ['servers.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('server_snapshots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_server_snapshots_server_id'), ['server_id'], unique=False)
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('snapshot_fee_micros', sa.BigInteger(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('snapshot_fee_micros')
    with op.batch_alter_table('server_snapshots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_server_snapshots_server_id'))
    op.drop_table('server_snapshots')
