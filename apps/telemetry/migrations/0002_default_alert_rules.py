from django.db import migrations

DEFAULT_RULES = [
    # name, kind, threshold, duration_s, action, severity
    ("GPU too hot", "gpu_temperature", 85.0, 30, "mark_hot", "critical"),
    ("XID error", "gpu_xid", 0.0, 0, "mark_faulty", "critical"),
    ("GPU memory almost full", "gpu_memory", 95.0, 60, "none", "warning"),
    ("GPU not answering", "gpu_no_data", 0.0, 30, "none", "critical"),
    ("Job idle on its GPUs", "job_idle", 5.0, 15 * 60, "none", "warning"),
    ("Host missing heartbeats", "host_heartbeat", 0.0, 30, "none", "critical"),
    ("Job past its expected end", "job_overrun", 1.0, 0, "none", "warning"),
]


def create_rules(apps, schema_editor):
    AlertRule = apps.get_model("telemetry", "AlertRule")
    for name, kind, threshold, duration_s, action, severity in DEFAULT_RULES:
        AlertRule.objects.get_or_create(
            name=name,
            defaults={"kind": kind, "threshold": threshold, "duration_s": duration_s, "action": action,
                      "severity": severity},
        )


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0001_initial")]
    operations = [migrations.RunPython(create_rules, migrations.RunPython.noop)]
