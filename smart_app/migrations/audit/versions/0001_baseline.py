"""The audit schema of the release before migrations (167caf1), as Alembic's autogenerate wrote
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
    'audit.question': '',
    'audit.data': '{}',
}


def schema(op):
    op.create_table('audit',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=30), nullable=False),
    sa.Column('tenant', sa.String(length=40), nullable=False),
    sa.Column('clinician', sa.String(length=300), nullable=False),
    sa.Column('patient_id', sa.String(length=200), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_audit_at'), 'audit', ['at'], unique=False)
    op.create_index(op.f('ix_audit_patient_id'), 'audit', ['patient_id'], unique=False)


def upgrade():
    upgrade_to_baseline(op.get_bind(), schema, DEFAULTS)


downgrade = forward_only
