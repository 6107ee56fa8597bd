"""Drive Superset in headless Chromium against `dpsql serve` (run by ../superset_e2e.py, in Superset's venv).

Each step prints one JSON line {"step", "ok", "detail"} and saves a screenshot where a person would look.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright


def report(step: str, ok: bool, detail: str = "") -> None:
    print(json.dumps({"step": step, "ok": ok, "detail": detail[:500]}), flush=True)


def api(page: Page, method: str, path: str, body: dict | None = None) -> dict:
    token = page.request.get("/api/v1/security/csrf_token/").json()["result"]
    response = page.request.fetch(path, method=method, data=json.dumps(body) if body is not None else None,
                                  headers={"Content-Type": "application/json", "X-CSRFToken": token,
                                           "Referer": page.url})
    try:
        payload = response.json()
    except Exception:  # noqa: BLE001 - an HTML error page
        payload = {"text": response.text()[:300]}
    payload["status"] = response.status
    return payload


def login(page: Page, base: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#username", "admin")
    page.fill("#password", "admin")
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url, timeout=30_000)
    report("login", True)


def connect_database(page: Page, uri: str) -> int:
    tested = api(page, "POST", "/api/v1/database/test_connection/",
                 {"sqlalchemy_uri": uri, "database_name": "dpsql demo", "engine": "postgresql"})
    report("database connection test", tested["status"] == 200, json.dumps(tested)[:300])
    created = api(page, "POST", "/api/v1/database/", {"database_name": "dpsql demo", "sqlalchemy_uri": uri,
                                                       "expose_in_sqllab": True, "allow_run_async": False})
    report("database created", created["status"] == 201, json.dumps(created)[:300])
    return created["id"]


def sync_dataset(page: Page, database_id: int, table: str) -> int:
    created = api(page, "POST", "/api/v1/dataset/", {"database": database_id, "schema": "public",
                                                      "table_name": table})
    dataset_id = created.get("id", 0)
    read = api(page, "GET", f"/api/v1/dataset/{dataset_id}") if dataset_id else {}
    columns = [c["column_name"] for c in read.get("result", {}).get("columns", [])]
    report(f"dataset {table} synced", created["status"] == 201 and bool(columns),
           f"columns {columns}" if columns else json.dumps(created)[:300])
    return dataset_id


def sql_lab(page: Page, base: str, out: Path, sql: str, expect: str, name: str) -> None:
    """Run `sql` in a new SQL Lab tab and wait for `expect` on the page (a result value or an error's text)."""
    page.goto(f"{base}/sqllab/")
    page.wait_for_selector(".SqlEditorTabs", timeout=60_000)
    empty = page.get_by_text("Add a new tab", exact=True)
    (empty if empty.count() else page.locator(".ant-tabs-nav-add")).first.click()  # the first tab, or another
    page.wait_for_timeout(1000)
    editor = page.locator(".ace_editor:visible").last
    editor.wait_for(timeout=60_000)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(sql)  # (typing would trigger the editor's autocomplete)
    page.get_by_role("button", name="Run").click()
    try:
        page.wait_for_selector(f"text={expect}", timeout=60_000)
        ok, detail = True, f"shows {expect!r}"
    except Exception as exc:  # noqa: BLE001
        ok, detail = False, str(exc)
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)
    report(f"SQL Lab: {sql}", ok, detail)


def drawn(page: Page, selector: str, settle_ms: int) -> list[str]:
    """Wait for `selector`, let the charts' queries finish, and return the errors Superset shows (none: drawn)."""
    try:
        page.wait_for_selector(selector, timeout=60_000)
        page.wait_for_timeout(settle_ms)
        return [e.inner_text() for e in page.query_selector_all(".alert-danger, .ant-alert-error")]
    except Exception as exc:  # noqa: BLE001
        return [str(exc)]


def chart(page: Page, base: str, out: Path, dataset_id: int, name: str, viz: str, drops: list[tuple[str, str]]
          ) -> int:
    """Build a chart in Explore as a person would: drag columns and metrics from the dataset panel onto the
    controls (`drops`: (item, the control's drop-zone text)), create it (its query runs through dpsql), save it."""
    page.goto(f"{base}/explore/?datasource_type=table&datasource_id={dataset_id}&viz_type={viz}")
    page.wait_for_selector("text=Drop columns/metrics here or click", timeout=60_000)
    for item, zone in drops:
        page.get_by_text(item, exact=True).first.drag_to(page.get_by_text(zone).first)
        page.wait_for_timeout(500)
    page.get_by_role("button", name="Create chart").click()
    errors = drawn(page, ".chart-container, .slice_container", 4000)
    file = out / f"chart_{viz}.png"
    page.screenshot(path=str(file), full_page=True)
    page.get_by_role("button", name="Save").first.click()
    page.fill("[data-test=new-chart-name]", name)
    page.locator(".ant-modal button", has_text="Save").last.click()
    page.wait_for_timeout(3000)
    charts = api(page, "GET", "/api/v1/chart/").get("result", [])
    chart_id = next((c["id"] for c in charts if c.get("slice_name") == name), 0)
    report(f"{name} ({viz}) built in Explore and saved", chart_id > 0 and not errors,
           "; ".join(errors) or f"saved as chart {chart_id}, {file.name}")
    return chart_id


def dashboard(page: Page, base: str, out: Path, charts: list[int]) -> None:
    position = {"DASHBOARD_VERSION_KEY": "v2", "ROOT_ID": {"type": "ROOT", "id": "ROOT_ID", "children": ["GRID_ID"]},
                "GRID_ID": {"type": "GRID", "id": "GRID_ID", "children": ["ROW-1"], "parents": ["ROOT_ID"]},
                "ROW-1": {"type": "ROW", "id": "ROW-1", "children": [f"CHART-{c}" for c in charts],
                          "parents": ["ROOT_ID", "GRID_ID"], "meta": {"background": "BACKGROUND_TRANSPARENT"}}}
    for c in charts:
        position[f"CHART-{c}"] = {"type": "CHART", "id": f"CHART-{c}", "children": [],
                                  "parents": ["ROOT_ID", "GRID_ID", "ROW-1"],
                                  "meta": {"chartId": c, "width": 6, "height": 50}}
    created = api(page, "POST", "/api/v1/dashboard/", {"dashboard_title": "dpsql demo",
                                                        "position_json": json.dumps(position), "published": True})
    dashboard_id = created.get("id", 0)
    for c in charts:
        api(page, "PUT", f"/api/v1/chart/{c}", {"dashboards": [dashboard_id]})
    page.goto(f"{base}/superset/dashboard/{dashboard_id}/?force=true")
    errors = drawn(page, ".dashboard-component-chart-holder", 8000)
    page.screenshot(path=str(out / "dashboard.png"), full_page=True)
    report("dashboard refresh", created["status"] == 201 and not errors, "; ".join(errors) or "both charts drawn")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--superset", required=True)
    parser.add_argument("--uri", required=True, help="SQLAlchemy URI of dpsql serve")
    parser.add_argument("--out", required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900}, base_url=args.superset)
        started = time.monotonic()
        login(page, args.superset)
        database_id = connect_database(page, args.uri)
        dataset_id = sync_dataset(page, database_id, "visits")
        sync_dataset(page, database_id, "people")
        sql_lab(page, args.superset, out, "SELECT category, COUNT(*) AS visits, AVG(amount) AS avg_amount "
                "FROM visits GROUP BY category ORDER BY visits DESC", "vaccination", "sqllab")
        sql_lab(page, args.superset, out, "SELECT * FROM people LIMIT 100", "dpsql answers aggregates",
                "sqllab_refused")
        bar = chart(page, args.superset, out, dataset_id, "Visits per category", "echarts_timeseries_bar",
                    [("category", "Drop a column here or click"), ("COUNT(*)", "Drop columns/metrics here or click")])
        table = chart(page, args.superset, out, dataset_id, "Visits table", "table",
                      [("category", "Drop columns here or click"), ("COUNT(*)", "Drop columns/metrics here or click")])
        dashboard(page, args.superset, out, [bar, table])
        report("total", True, f"{time.monotonic() - started:.0f} s")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
