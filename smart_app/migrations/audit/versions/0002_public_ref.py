"""Issue 42: an audit entry is named outside by a random `ref`, never by its row number. Entries
written before get a ref of their own, so a draft saved before the upgrade can still be written back.

Revision ID: 0002
Revises: 0001
"""
import secrets

import sqlalchemy as sa
from alembic import op

from fhir_ingest.connection.schema import forward_only

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("audit") as batch:
        batch.add_column(sa.Column("ref", sa.String(length=40), nullable=True))
        batch.create_unique_constraint("uq_audit_ref", ["ref"])
    bind = op.get_bind()
    unnamed = [row[0] for row in bind.execute(sa.text("SELECT id FROM audit WHERE ref IS NULL"))]
    for entry_id in unnamed:
        bind.execute(sa.text("UPDATE audit SET ref = :ref WHERE id = :id"),
                     {"ref": secrets.token_urlsafe(16), "id": entry_id})


downgrade = forward_only
