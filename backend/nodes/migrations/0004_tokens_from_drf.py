"""Carry DRF's one-token-per-user keys over to ApiToken, so a script's token survives the upgrade.

Each becomes a script token named after its origin, valid as long as it was before (issued +
DEFL_TOKEN_TTL_S); its key is stored as its SHA-256 only. The old table is left as it was.
"""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations


def carry_over(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("nodes", "ApiToken")
    lifetime = timedelta(seconds=settings.DEFL_TOKEN_TTL_S)
    for token in Token.objects.all():
        digest = hashlib.sha256(token.key.encode()).hexdigest()
        ApiToken.objects.get_or_create(
            digest=digest,
            defaults=dict(
                user_id=token.user_id,
                name="token from before the upgrade",
                kind="script",
                prefix=token.key[:8],
                created=token.created,
                expires=token.created + lifetime,
            ),
        )


class Migration(migrations.Migration):
    dependencies = [("nodes", "0003_api_tokens"), ("authtoken", "0004_alter_tokenproxy_options")]

    operations = [migrations.RunPython(carry_over, migrations.RunPython.noop)]
