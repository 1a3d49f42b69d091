"""Similar patients and cohort comparisons per registration (issue 37): off for every EHR
registered before, until hospital IT turns it on with `chartcite ehr update NAME --similar-patients on`.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

from fhir_ingest.connection.schema import forward_only

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("ehr") as batch:
        batch.add_column(sa.Column("similar_patients", sa.Boolean(), nullable=False, server_default=sa.false()))


downgrade = forward_only
