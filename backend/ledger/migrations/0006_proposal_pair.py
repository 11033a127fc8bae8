"""A model hash may be proposed with several references (one of them hijacked): each
(hash, reference) pair is its own proposal, as FederatedLearning keys them."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0005_score_commitment"),
    ]

    # The new index first: on MySQL the job foreign key needs an index that starts with job_id.
    operations = [
        migrations.AddConstraint(
            model_name="globalmodelproposal",
            constraint=models.UniqueConstraint(
                fields=("job", "round", "model_hash", "reference"), name="ledger_proposal_pair_unique"
            ),
        ),
        migrations.RemoveConstraint(
            model_name="globalmodelproposal",
            name="ledger_proposal_unique",
        ),
    ]
