"""The node's shared cache table (settings.CACHES: login throttles and lockouts, replay guards).

All of a node's processes (gunicorn workers, the agent, Celery) must see the same counters, so
the default cache is a table in the node's database. `migrate` creates it wherever a node's
database is set up (manage.py migrate, NodeProcess.migrate, the test database); with
DEFL_CACHE_URL set (Redis) createcachetable has nothing to do.
"""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("nodes", "0001_initial")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop, elidable=False)]
