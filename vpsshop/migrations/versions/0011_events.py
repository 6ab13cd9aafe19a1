"""events: the outbox, consumer cursors, webhook endpoints, deliveries and their attempts

Revision ID: 0011
Revises: 0002, 0003
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa
import vpsshop.models


revision = '0011'
down_revision = '0008'
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table('events',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('public_id', sa.String(length=40), nullable=False),
    sa.Column('type', sa.String(length=64), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('resource_type', sa.String(length=32), nullable=False),
    sa.Column('resource_id', sa.String(length=64), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('public_id'),
    sa.UniqueConstraint('seq')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_account_id_seq', ['account_id', 'seq'], unique=False)

    op.create_table('event_cursors',
    sa.Column('name', sa.String(length=120), nullable=False),
    sa.Column('last_id', sa.BigInteger(), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('retry_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('locked_by', sa.String(length=64), nullable=True),
    sa.Column('locked_until', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('updated_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )

    op.create_table('webhook_endpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('url', sa.String(length=2000), nullable=False),
    sa.Column('description', sa.String(length=200), nullable=True),
    sa.Column('event_types', sa.Text(), nullable=False),
    sa.Column('secret_enc', sa.String(length=500), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('disabled_reason', sa.String(length=500), nullable=True),
    sa.Column('since_event_id', sa.BigInteger(), nullable=False),
    sa.Column('failing_since', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('disabled_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('deleted_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_endpoints_account_id'), ['account_id'], unique=False)

    op.create_table('webhook_deliveries',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('endpoint_id', sa.Integer(), nullable=False),
    sa.Column('event_id', sa.BigInteger(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('fanout_key', sa.String(length=80), nullable=True),
    sa.Column('redelivery', sa.Boolean(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('locked_by', sa.String(length=64), nullable=True),
    sa.Column('locked_until', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('created_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('finished_at', vpsshop.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoints.id'], ),
    sa.ForeignKeyConstraint(['event_id'], ['events.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('fanout_key')
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_webhook_deliveries_due', ['status', 'next_attempt_at'], unique=False)
        batch_op.create_index('ix_webhook_deliveries_endpoint_id', ['endpoint_id', 'id'], unique=False)

    op.create_table('webhook_attempts',
    sa.Column('id', BigId, autoincrement=True, nullable=False),
    sa.Column('delivery_id', sa.BigInteger(), nullable=False),
    sa.Column('endpoint_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.String(length=500), nullable=True),
    sa.Column('response_excerpt', sa.String(length=500), nullable=True),
    sa.Column('duration_ms', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=64), nullable=True),
    sa.Column('started_at', vpsshop.models.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['delivery_id'], ['webhook_deliveries.id'], ),
    sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoints.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('webhook_attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_attempts_delivery_id'), ['delivery_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('webhook_attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_attempts_delivery_id'))
    op.drop_table('webhook_attempts')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_deliveries_endpoint_id')
        batch_op.drop_index('ix_webhook_deliveries_due')
    op.drop_table('webhook_deliveries')
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_endpoints_account_id'))
    op.drop_table('webhook_endpoints')
    op.drop_table('event_cursors')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_account_id_seq')
    op.drop_table('events')
