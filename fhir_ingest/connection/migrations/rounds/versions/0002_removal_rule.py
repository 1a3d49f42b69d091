"""Issue 41: a round may be allowed to carry out removals over the budget (--allow-removals), and a
file keeps the validator (ETag or Last-Modified) its first response gave, for If-Range resumes.

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
    with op.batch_alter_table("bulk_round") as batch:
        batch.add_column(sa.Column("allow_removals", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("bulk_file") as batch:
        batch.add_column(sa.Column("validator", sa.Text(), nullable=False, server_default=""))


downgrade = forward_only
