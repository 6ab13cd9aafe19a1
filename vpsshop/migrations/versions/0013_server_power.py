"""servers.power: whether the VM is running or stopped, as the last hypervisor job left it

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('power', sa.String(length=16), nullable=True))
    # Existing servers: active ones run, suspended ones are stopped; an active server whose last power
    # action was a stop is stopped (as its job left it, unless that job failed).
    op.execute(
        "UPDATE servers SET power = CASE status WHEN 'active' THEN 'running' WHEN 'suspended' THEN 'stopped' END"
    )
    op.execute(
        "UPDATE servers SET power = 'stopped' WHERE status = 'active' AND ("
        "SELECT e.kind FROM server_events e WHERE e.server_id = servers.id AND e.kind IN "
        "('power_start', 'power_stop', 'power_reboot', 'resumed', 'reinstalled') ORDER BY e.id DESC LIMIT 1"
        ") = 'power_stop'"
    )


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('power')
