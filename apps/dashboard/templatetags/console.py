from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()


@register.filter
def reading(value: object, unit: str = "") -> str:
    """A telemetry reading with its unit, or "no data" (never a made-up 0)."""
    if value is None or value == "":
        return "no data"
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    text = f"{number:.0f}" if abs(number) >= 10 or number == int(number) else f"{number:.1f}"
    return f"{text}{unit}"


@register.filter
def hours(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


@register.filter
def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


@register.filter
def heat(value: float | None) -> str:
    """A CSS class for a utilization heat-map cell."""
    if value is None:
        return "heat-none"
    return f"heat-{min(int(float(value) // 20), 4)}"


@register.filter
def gib(value: float | None) -> str:
    """Megabytes as GiB with one decimal."""
    return "no data" if value is None else f"{float(value) / 1024:.1f}"


@register.filter
def as_json(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)


@register.filter
def num(value: float | None) -> str:
    """A measured number with a sensible precision (like the pages' JavaScript GC.fmt), or "no data"."""
    if value is None:
        return "no data"
    number = float(value)
    size = abs(number)
    if size >= 100:
        return f"{number:.0f}"
    if size >= 10:
        return f"{number:.1f}"
    if size >= 1:
        return f"{number:.2f}"
    return f"{number:.2g}"


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as people read them: 45 s, 12 min, 3.5 h (as the job page's script writes them)."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


WHEN_FORMATS = {"seconds": "%Y-%m-%d %H:%M:%S", "minutes": "%Y-%m-%d %H:%M"}


@register.filter
def when(value: datetime | None, precision: str = "seconds") -> str:
    """Every time a page shows, one way: 24-hour, with its zone ("2026-12-03 11:30:05 UTC", in the console's
    TIME_ZONE), in a <time> element carrying the instant; the pages' script (GC.when in static/js/console.js) writes
    it again in the browser's own zone, the same way. None: "" (so `|default:"never"` applies)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, datetime):
        return str(value)
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    fmt = WHEN_FORMATS.get(precision, WHEN_FORMATS["seconds"])
    text = f"{local.strftime(fmt)} {local.tzname() or ''}".strip()
    return format_html('<time datetime="{}" data-when="{}">{}</time>', value.isoformat(), precision, text)


@register.filter
def mb_gib(value: float | None) -> str:
    """Megabytes (the agents' unit) as the pages show memory: GiB with one decimal and the unit."""
    if value is None or value == "":
        return "—"
    gib = float(value) / 1024
    return f"{gib:.2f} GiB" if 0 < gib < 1 else f"{gib:.1f} GiB"
