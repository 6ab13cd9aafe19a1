"""servers.firewall: the inbound rules of each server's firewall (issue 25, part 3)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('firewall', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('firewall')
