"""Check the Grafana dashboard against what the console exports.

    python deploy/grafana/check_dashboard.py [--prometheus http://127.0.0.1:9090]

- the dashboard is well-formed JSON, with the `DS_PROMETHEUS` datasource variable and the host and team variables;
- every PromQL expression (panels and template variables) names only metrics that apps/telemetry/metrics.py
  exports, and only labels those metrics carry (plus the `instance`, `job` and `exported_job` labels Prometheus adds
  or renames when it scrapes);
- with `--prometheus`, every expression (variables replaced by `.*`) also runs on that Prometheus, which must be
  scraping a console: each must parse, and each is listed with how many series it returned.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = HERE / "gpu-console.json"
METRICS = ROOT / "apps" / "telemetry" / "metrics.py"
SCRAPE_LABELS = {"instance", "job", "exported_job"}  # added by Prometheus; the console's `job` becomes exported_job
PROMQL_WORDS = {
    # functions, aggregations and keywords that may appear in the expressions
    "sum", "avg", "min", "max", "count", "count_values", "topk", "bottomk", "quantile", "stddev", "stdvar", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "vector", "scalar", "rate", "irate", "increase", "delta", "deriv", "abs", "clamp", "clamp_min", "clamp_max",
    "time", "timestamp", "label_replace", "label_join", "sort", "sort_desc", "absent", "changes", "resets",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "round", "ceil", "floor", "histogram_quantile", "label_values", "query_result", "inf", "nan",
}


def _strings(node: ast.expr, names: dict[str, list[str]]) -> list[str] | None:
    """The label names a `labels=` argument holds: a list of strings, a name bound to one, `[*name, "x"]`."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.List | ast.Tuple):
        out = []
        for item in node.elts:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                out.append(item.value)
            elif isinstance(item, ast.Starred) and (inner := _strings(item.value, names)) is not None:
                out.extend(inner)
            else:
                return None
        return out
    return None


def exported() -> dict[str, set[str]]:
    """Metric name -> label names, read from the console's collector source (apps/telemetry/metrics.py)."""
    tree = ast.parse(METRICS.read_text())
    names: dict[str, list[str]] = {}
    for node in ast.walk(tree):  # NAME = [...] anywhere (module constants, locals of the collector functions)
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and (value := _strings(node.value, names)) is not None):
            names[node.targets[0].id] = value
    metrics: dict[str, set[str]] = {}
    gauges = next((n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                   and n.targets[0].id == "GPU_GAUGES"), None)
    for row in getattr(gauges, "elts", []):  # (metric name, help, field, scale): families with GPU_LABELS
        metrics[row.elts[0].value] = set(names["GPU_LABELS"])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "GaugeMetricFamily" and node.args
                and isinstance(node.args[0], ast.Constant)):
            labels = next((k.value for k in node.keywords if k.arg == "labels"), None)
            found = _strings(labels, names) if labels is not None else []
            if found is None:
                raise SystemExit(f"{METRICS}: cannot read the labels of {node.args[0].value}")
            metrics[node.args[0].value] = set(found)
    return metrics


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    found = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"panel {panel.get('title')!r} ({target.get('refId')})", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            found.append((f"variable ${variable['name']}", query))
    return found


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for grouping in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {label.strip() for label in grouping.split(",") if label.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    label_values = re.match(r"\s*label_values\((?:([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*)?([A-Za-z_]+)\)\s*$", expr)
    if label_values:
        return ({label_values.group(1)} if label_values.group(1) else set()), {label_values.group(2)}
    tokens = set(re.findall(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)", text))
    return {t for t in tokens if t.lower() not in PROMQL_WORDS}, labels


def query(prometheus: str, expr: str) -> tuple[str | None, int]:
    url = f"{prometheus.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc).get("error", str(exc)), 0
    return (None, len(body["data"]["result"])) if body.get("status") == "success" else (body.get("error"), 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", help="a Prometheus scraping a console, to run every expression on")
    parser.add_argument("dashboard", nargs="?", type=Path, default=DASHBOARD)
    args = parser.parse_args()
    problems = []
    try:
        dashboard = json.loads(args.dashboard.read_text())
    except json.JSONDecodeError as exc:
        print(f"{args.dashboard}: not JSON: {exc}")
        return 1
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("DS_PROMETHEUS", {}).get("type") != "datasource":
        problems.append("no datasource variable DS_PROMETHEUS")
    for name in ("host", "team"):
        if name not in variables:
            problems.append(f"no template variable ${name}")
    metrics = exported()
    known_labels = set().union(*metrics.values()) | SCRAPE_LABELS
    exprs = expressions(dashboard)
    used = set()
    for where, expr in exprs:
        names, labels = names_in(expr)
        used |= names
        for name in sorted(names - set(metrics)):
            problems.append(f"{where}: {name} is not a metric the console exports")
        for label in sorted(labels - known_labels):
            problems.append(f"{where}: label {label!r} is on no exported metric")
        for name in names & set(metrics):
            for label in sorted(labels - metrics[name] - SCRAPE_LABELS):
                if not any(label in metrics[other] for other in names if other != name):
                    problems.append(f"{where}: {name} has no label {label!r}")
        if not names and not expr.startswith("label_values("):
            problems.append(f"{where}: names no metric: {expr}")
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problems.append(f"panel {panel['title']!r}: target not on ${{DS_PROMETHEUS}}")
    print(f"{len(exprs)} expressions; metrics used: {', '.join(sorted(used))}")
    print(f"exported but not on the dashboard: {', '.join(sorted(set(metrics) - used)) or 'none'}")
    if args.prometheus:
        for where, expr in exprs:
            if expr.startswith("label_values("):
                names, labels = names_in(expr)
                selector = next(iter(names)) if names else '{__name__=~".+"}'
                expr = f"group by ({next(iter(labels))}) ({selector})"
            runnable = expr.replace("$host", ".*").replace("$team", ".*")
            error, count = query(args.prometheus, runnable)
            if error:
                problems.append(f"{where}: Prometheus refused it: {error}")
            print(f"  {count:4d} series  {where}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
