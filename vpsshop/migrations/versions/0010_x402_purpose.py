"""x402 payments of an order or a renewal: what the authorization paid for, and whether it was made

Revision ID: 0010
Revises: 0011
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('purpose', sa.String(length=220), nullable=True))
        batch_op.add_column(sa.Column('outcome', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('x402_payments', schema=None) as batch_op:
        batch_op.drop_column('outcome')
        batch_op.drop_column('purpose')
