"""The rounds schema of the release before migrations (167caf1), as Alembic's autogenerate wrote
it from that release's models; its upgrade also brings a database made by that release or an older
one to it.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

from fhir_ingest.connection.schema import forward_only, upgrade_to_baseline

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# What a column added in place to an older release's table holds in its existing rows: that
# release's model defaults.
DEFAULTS = {
    'bulk_cursor.since': '',
    'bulk_cursor.reach_back': 0.0,
    'bulk_cursor.updated_at': 0.0,
    'bulk_file.type': '',
    'bulk_file.state': 'pending',
    'bulk_file.lines': 0,
    'bulk_file.bytes': 0,
    'bulk_file.attempts': 0,
    'bulk_file.error': '',
    'bulk_file.report': '{}',
    'bulk_part.state': 'pending',
    'bulk_part.claimed_by': '',
    'bulk_part.claimed_until': 0.0,
    'bulk_part.completions': 0,
    'bulk_part.claimed_at': 0.0,
    'bulk_part.done_at': 0.0,
    'bulk_part.error': '',
    'bulk_part.result': '{}',
    'bulk_round.full': False,
    'bulk_round.since': '',
    'bulk_round.state': 'exporting',
    'bulk_round.status_url': '',
    'bulk_round.transaction_time': '',
    'bulk_round.types': '',
    'bulk_round.manifest': '{}',
    'bulk_round.deleted': '[]',
    'bulk_round.notes': '[]',
    'bulk_round.export_errors': '[]',
    'bulk_round.summary': '{}',
    'bulk_round.lease_holder': '',
}


def schema(op):
    cursors_and_files(op)
    parts_rounds_and_leases(op)


def cursors_and_files(op):
    op.create_table('bulk_cursor',
    sa.Column('tenant', sa.String(length=40), nullable=False),
    sa.Column('group_id', sa.String(length=200), nullable=False),
    sa.Column('since', sa.String(length=40), nullable=False),
    sa.Column('reach_back', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'group_id')
    )
    op.create_table('bulk_file',
    sa.Column('round_id', sa.String(length=40), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=10), nullable=False),
    sa.Column('type', sa.String(length=60), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('lines', sa.Integer(), nullable=False),
    sa.Column('bytes', sa.Integer(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('report', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('round_id', 'n')
    )


def parts_rounds_and_leases(op):
    op.create_table('bulk_part',
    sa.Column('round_id', sa.String(length=40), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('patients', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('claimed_by', sa.String(length=100), nullable=False),
    sa.Column('claimed_until', sa.Float(), nullable=False),
    sa.Column('completions', sa.Integer(), nullable=False),
    sa.Column('claimed_at', sa.Float(), nullable=False),
    sa.Column('done_at', sa.Float(), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('result', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('round_id', 'n')
    )
    op.create_table('bulk_round',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant', sa.String(length=40), nullable=False),
    sa.Column('group_id', sa.String(length=200), nullable=False),
    sa.Column('full', sa.Boolean(), nullable=False),
    sa.Column('since', sa.String(length=40), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('status_url', sa.Text(), nullable=False),
    sa.Column('transaction_time', sa.String(length=40), nullable=False),
    sa.Column('types', sa.Text(), nullable=False),
    sa.Column('manifest', sa.Text(), nullable=False),
    sa.Column('deleted', sa.Text(), nullable=False),
    sa.Column('notes', sa.Text(), nullable=False),
    sa.Column('export_errors', sa.Text(), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('lease_holder', sa.String(length=100), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_bulk_round_tenant'), 'bulk_round', ['tenant'], unique=False)
    op.create_table('sync_lease',
    sa.Column('tenant', sa.String(length=40), nullable=False),
    sa.Column('group_id', sa.String(length=200), nullable=False),
    sa.Column('holder', sa.String(length=100), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('taken_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'group_id')
    )


def upgrade():
    upgrade_to_baseline(op.get_bind(), schema, DEFAULTS)


downgrade = forward_only
