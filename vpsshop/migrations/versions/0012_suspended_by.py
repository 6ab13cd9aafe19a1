"""servers.suspended_by: who suspended a server (non-payment or the shop), so renewing lifts only the first

Revision ID: 0012
Revises: 0009
Create Date: 2026-11-24
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('suspended_by', sa.String(length=16), nullable=True))
    # Servers suspended before this column: `vpsshop admin suspend` wrote "Suspended: <reason>" as the
    # reason, the lifecycle task "The paid period ended ...".
    op.execute(
        "UPDATE servers SET suspended_by = CASE WHEN status_reason LIKE 'Suspended: %' THEN 'admin' "
        "ELSE 'nonpayment' END WHERE status = 'suspended'"
    )


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('suspended_by')
