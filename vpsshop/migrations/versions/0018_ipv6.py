"""ipv6_leases, servers.ipv6 and servers.ipv6_prefix: an IPv6 address per server (issue 25)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ipv6_leases',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('pool', sa.String(length=64), nullable=False),
        sa.Column('address', sa.String(length=49), nullable=False),
        sa.Column('server_id', sa.Integer(), nullable=False),
        sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['server_id'], ['servers.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('pool', 'address', name='uq_ipv6_leases_pool_address'),
        sa.UniqueConstraint('server_id'),
    )
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ipv6', sa.String(length=45), nullable=True))
        batch_op.add_column(sa.Column('ipv6_prefix', sa.String(length=49), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('ipv6_prefix')
        batch_op.drop_column('ipv6')
    op.drop_table('ipv6_leases')
