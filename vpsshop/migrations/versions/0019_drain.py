"""drained_hosts and server_jobs.target: drain a host, migrate a server (issue 28 part 2)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'drained_hosts',
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('reason', sa.String(length=500), nullable=True),
        sa.Column('drained_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('host'),
    )
    with op.batch_alter_table('server_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('target', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('server_jobs', schema=None) as batch_op:
        batch_op.drop_column('target')
    op.drop_table('drained_hosts')
