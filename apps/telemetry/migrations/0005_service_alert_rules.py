from django.db import migrations


def create_rules(apps, schema_editor):
    AlertRule = apps.get_model("telemetry", "AlertRule")
    AlertRule.objects.get_or_create(name="Service slower than its target",
                                    defaults={"kind": "service_latency", "threshold": 1.0, "duration_s": 60})
    AlertRule.objects.get_or_create(name="Service errors",
                                    defaults={"kind": "service_errors", "threshold": 0.05, "duration_s": 60,
                                              "severity": "critical"})


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0004_alert_rule_kinds")]
    operations = [migrations.RunPython(create_rules, migrations.RunPython.noop)]
