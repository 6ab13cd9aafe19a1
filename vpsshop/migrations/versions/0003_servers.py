"""servers: password, idempotency and placement columns; jobs, events, ip leases

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-22
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0003'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('root_password_enc', sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column('idempotency_key', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('request_digest', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('domain', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('host', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('status_reason', sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column('auto_renew', sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column('suspended_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('terminated_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.create_index('ux_servers_account_idempotency', ['account_id', 'idempotency_key'], unique=True)

    op.create_table('server_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('server_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('run_after', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('locked_until', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('locked_by', sa.String(length=64), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('finished_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('server_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_server_jobs_claim', ['status', 'run_after'], unique=False)
        batch_op.create_index(batch_op.f('ix_server_jobs_server_id'), ['server_id'], unique=False)

    op.create_table('server_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('server_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('detail', sa.String(length=500), nullable=True),
    sa.Column('once_key', sa.String(length=200), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('once_key')
    )
    with op.batch_alter_table('server_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_server_events_server_id'), ['server_id'], unique=False)

    op.create_table('ip_leases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('pool', sa.String(length=64), nullable=False),
    sa.Column('address', sa.String(length=45), nullable=False),
    sa.Column('server_id', sa.Integer(), nullable=False),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('pool', 'address', name='uq_ip_leases_pool_address'),
    sa.UniqueConstraint('server_id')
    )


def downgrade() -> None:
    op.drop_table('ip_leases')
    with op.batch_alter_table('server_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_server_events_server_id'))
    op.drop_table('server_events')
    with op.batch_alter_table('server_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_server_jobs_server_id'))
        batch_op.drop_index('ix_server_jobs_claim')
    op.drop_table('server_jobs')
    with op.batch_alter_table('servers', schema=None) as batch_op:
        batch_op.drop_index('ux_servers_account_idempotency')
        for column in ('terminated_at', 'suspended_at', 'auto_renew', 'status_reason', 'host', 'domain',
                       'request_digest', 'idempotency_key', 'root_password_enc'):
            batch_op.drop_column(column)
