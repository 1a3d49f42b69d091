"""The registry schema of the release before migrations (167caf1), as Alembic's autogenerate wrote
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
    'ehr.scopes': 'v2',
    'ehr.frame_origins': '',
    'ehr.group_id': '',
    'ehr.write_back': False,
    'ehr.last_sync_at': 0.0,
    'ehr.last_sync_status': 'never',
    'ehr.bulk_since': '',
    'ehr.client_auth': '',
    'ehr.client_secret': '',
    'ehr.request_scopes': 'openid fhirUser offline_access',
    'ehr.secret_encoding': 'form',
    'ehr.backend_client_id': '',
    'ehr.backend_client_secret': '',
    'ehr.backend_only': False,
    'ehr.bulk_types': '',
    'signing_key.retire_after': 0.0,
}


def schema(op):
    op.create_table('ehr',
    sa.Column('name', sa.String(length=40), nullable=False),
    sa.Column('iss', sa.String(length=500), nullable=False),
    sa.Column('client_id', sa.String(length=200), nullable=False),
    sa.Column('scopes', sa.String(length=4), nullable=False),
    sa.Column('frame_origins', sa.Text(), nullable=False),
    sa.Column('group_id', sa.String(length=200), nullable=False),
    sa.Column('write_back', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('last_sync_at', sa.Float(), nullable=False),
    sa.Column('last_sync_status', sa.Text(), nullable=False),
    sa.Column('bulk_since', sa.String(length=40), nullable=False),
    sa.Column('client_auth', sa.String(length=30), nullable=False),
    sa.Column('client_secret', sa.Text(), nullable=False),
    sa.Column('request_scopes', sa.Text(), nullable=False),
    sa.Column('secret_encoding', sa.String(length=10), nullable=False),
    sa.Column('backend_client_id', sa.String(length=200), nullable=False),
    sa.Column('backend_client_secret', sa.Text(), nullable=False),
    sa.Column('backend_only', sa.Boolean(), nullable=False),
    sa.Column('bulk_types', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('name'),
    sa.UniqueConstraint('iss')
    )
    op.create_table('patient_sync',
    sa.Column('tenant', sa.String(length=40), nullable=False),
    sa.Column('patient_id', sa.String(length=200), nullable=False),
    sa.Column('synced_at', sa.Float(), nullable=False),
    sa.Column('server_time', sa.String(length=40), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'patient_id')
    )
    op.create_table('secret',
    sa.Column('key', sa.String(length=120), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('signing_key',
    sa.Column('kid', sa.String(length=100), nullable=False),
    sa.Column('alg', sa.String(length=10), nullable=False),
    sa.Column('private_jwk', sa.Text(), nullable=False),
    sa.Column('public_jwk', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('retire_after', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('kid')
    )


def upgrade():
    upgrade_to_baseline(op.get_bind(), schema, DEFAULTS)


downgrade = forward_only
