"""server access: the SSH key store, order-time keys and user data, console tickets, reverse DNS

Revision ID: 0009
Revises: 0011
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0009'
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('ssh_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('key_type', sa.String(length=32), nullable=False),
    sa.Column('bits', sa.Integer(), nullable=False),
    sa.Column('public_key', sa.Text(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('account_id', 'fingerprint', name='uq_ssh_keys_account_fingerprint')
    )
    with op.batch_alter_table('ssh_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ssh_keys_account_id'), ['account_id'], unique=False)

    op.create_table('console_tickets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('server_id', sa.Integer(), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('used_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    with op.batch_alter_table('console_tickets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_console_tickets_server_id'), ['server_id'], unique=False)

    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ssh_keys', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('user_data_enc', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('reverse_dns', sa.String(length=253), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_column('reverse_dns')
        batch_op.drop_column('user_data_enc')
        batch_op.drop_column('ssh_keys')
    with op.batch_alter_table('console_tickets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_console_tickets_server_id'))
    op.drop_table('console_tickets')
    with op.batch_alter_table('ssh_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ssh_keys_account_id'))
    op.drop_table('ssh_keys')
