"""servers.ready_at and servers.host_keys: readiness and SSH host keys reported by the guest

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa

import vpsshop.models


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Servers made before: ready_at stays null (nobody reported), and so do their host keys.
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ready_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('host_keys', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('host_keys')
        batch_op.drop_column('ready_at')
